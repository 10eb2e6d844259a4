from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        from configfile.prune import history_register
        from gateway.ledger_history import ledger_refers

        history_register(ledger_refers)
