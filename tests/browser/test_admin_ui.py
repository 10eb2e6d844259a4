"""The admin and the ops pages in a real browser against a real gateway (SPEC A2, A4, H3).

What only a browser sees: the pages are styled (light and dark) because the gateway serves the
static files; the autocomplete fields work, since choosing a tenant, team, app, user or partner
there needs the admin's JavaScript; a key's secret is shown once; a limit added in a form
binds the next request; a tenant admin sees only their tenant; the saturation page draws a burst;
an alias typed on a model's page serves the next request; a provider's projects and key pool
are edited on its page; batches are shown, never added, in the admin.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from tests.browser.pages import VIEWPORT, Screens, context_new, sign_in
from tests.stack import Stack, wait_until

pytestmark = pytest.mark.e2e

ACME_KEY = "sk-sy-test-acme-web-0001"
# Computed colours that only the admin's stylesheets give (base.css, dark_mode.css).
LIGHT_HEADER_BG = "rgb(65, 118, 144)"  # --secondary: #417690
LIGHT_BODY_BG = "rgb(255, 255, 255)"
DARK_BODY_BG = "rgb(18, 18, 18)"  # --body-bg: #121212


def chat(stack: Stack, key: str) -> httpx.Response:
    return httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "acme/chat-small", "messages": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )


def problems_watch(page: Page) -> list[str]:
    """Every failed response, console error and script error the page meets from now on (the
    favicon aside: the admin has none, and Chromium asks for one anyway)."""
    problems: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error" and not message.location["url"].endswith("/favicon.ico"):
            problems.append(f"console: {message.text} ({message.location['url']})")

    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else 0)
    page.on("console", console)
    page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
    return problems


def autocomplete_pick(
    page: Page, field: str, term: str, choice: str, shot: Callable[[], None] | None = None
) -> None:
    """Choose ``choice`` in the autocomplete field ``field`` as a person does: open the widget,
    type, click the suggestion the server sent back. Without the admin's JavaScript the field
    is an empty <select> and there is nothing to click."""
    page.click(f"#id_{field} + .select2 .select2-selection")
    page.fill(".select2-container--open .select2-search__field", term)
    option = page.locator(
        ".select2-container--open .select2-results__option[role=option]", has_text=choice
    ).first
    option.wait_for()
    if shot:
        shot()
    option.click()
    assert page.locator(f"#id_{field} option:checked").inner_text() == choice


def save(page: Page, button: str = "_save") -> None:
    """Submit the form and wait for the page that answers it: one without form errors."""
    with page.expect_navigation():
        page.click(f"input[name={button}]")
    errors = page.locator(".errornote, .errorlist").all_inner_texts()
    assert not errors, errors


@pytest.mark.parametrize(("scheme", "body_bg"), [("light", LIGHT_BODY_BG), ("dark", DARK_BODY_BG)])
def test_the_admin_is_styled_in_light_and_dark(
    ui_stack: Stack,
    browser: Browser,
    admin_password: str,
    screens: Screens,
    scheme: str,
    body_bg: str,
) -> None:
    context = context_new(browser, ui_stack, color_scheme=scheme)
    page = context.new_page()
    problems = problems_watch(page)
    stylesheets: list[httpx.Headers] = []
    page.on(
        "response",
        lambda r: (
            stylesheets.append(httpx.Headers(r.headers))
            if re.search(r"/static/admin/css/base\.[0-9a-f]{12}\.css$", r.url)
            else None
        ),
    )
    page.goto("/admin/login/")
    screens.shot(page, f"01-login-{scheme}")
    sign_in(page, "admin", admin_password)
    screens.shot(page, f"02-admin-index-{scheme}")

    assert problems == []
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == body_bg
    if scheme == "light":
        header = "getComputedStyle(document.getElementById('header')).backgroundColor"
        assert page.evaluate(header) == LIGHT_HEADER_BG
    # Hashed names are immutable: a browser never asks for them again.
    assert stylesheets, "the page links base.css by its hashed name"
    assert "immutable" in stylesheets[0]["cache-control"]
    context.close()


def test_staff_build_a_tenant_to_a_working_key_and_limit_it_through_the_admin(
    ui_stack: Stack, browser: Browser, admin_password: str, screens: Screens
) -> None:
    context = context_new(browser, ui_stack)
    page = context.new_page()
    problems = problems_watch(page)
    sign_in(page, "admin", admin_password)

    # A tenant of the reseller, picked with the partner autocomplete.
    page.goto("/admin/tenants/tenant/add/")
    page.fill("#id_name", "initech")
    autocomplete_pick(
        page, "partner", "resel", "resellerco", lambda: screens.shot(page, "03-tenant-add")
    )
    save(page)
    assert page.locator(".messagelist .success").count() == 1

    page.goto("/admin/tenants/team/add/")
    page.fill("#id_name", "platform")
    autocomplete_pick(page, "tenant", "init", "initech", lambda: screens.shot(page, "04-team-add"))
    save(page)

    page.goto("/admin/tenants/app/add/")
    page.fill("#id_name", "chatbot")
    autocomplete_pick(page, "team", "platf", "initech/platform")
    autocomplete_pick(
        page,
        "default_workload",
        "inter",
        "interactive",
        lambda: screens.shot(page, "05-app-add"),
    )
    save(page)

    # The key: its secret is on the page that answers the form, and nowhere ever after.
    page.goto("/admin/tenants/apikey/add/")
    page.fill("#id_name", "web")
    autocomplete_pick(
        page,
        "app",
        "chatb",
        "initech/platform/chatbot (production)",
        lambda: screens.shot(page, "06-key-add"),
    )
    save(page)
    secret = page.input_value("#api-key-secret")
    assert secret.startswith("sk-sy-") and len(secret) > 30
    screens.shot(page, "07-key-secret-once")

    page.click("text=Go to the key")
    prefix = page.locator(".field-prefix .readonly").inner_text()
    assert secret.startswith(prefix) and len(prefix) < len(secret)
    assert secret not in page.content()
    screens.shot(page, "08-key-prefix-only")
    page.goto("/admin/tenants/apikey/?q=initech")
    assert prefix in page.content() and secret not in page.content()

    # The gateway picks the new key up from the configuration version the save bumped.
    wait_until(lambda: chat(ui_stack, secret).status_code == 200, timeout=10, what="the new key")

    # One request a minute for the app, added on its page with the inline's JavaScript row.
    page.goto("/admin/tenants/app/?q=chatbot")
    page.click("#result_list tbody a >> text=chatbot")
    page.click("#buckets-group .add-row a")
    page.select_option("#id_buckets-0-dimension", "requests")
    page.select_option("#id_buckets-0-rule", "refill")
    page.fill("#id_buckets-0-capacity", "1")
    page.fill("#id_buckets-0-period_seconds", "60")
    screens.shot(page, "09-app-bucket-add")
    save(page, "_continue")
    bucket = page.input_value("#id_buckets-0-name")
    assert bucket == "app:initech/platform/chatbot:requests:1m"
    screens.shot(page, "10-app-bucket-saved")
    assert problems == []

    # Requests sent before the gateway reloads do not count against it; the first one it
    # counts names it among the caller's limits and takes its only request.
    def limited() -> bool:
        answer = chat(ui_stack, secret)
        assert answer.status_code == 200, answer.text
        return answer.headers.get("x-ratelimit-limit-requests") == "1"

    wait_until(limited, timeout=10, what="the new limit in the gateway")
    refused = chat(ui_stack, secret)
    assert refused.status_code == 429
    assert refused.headers["x-switchyard-bucket"] == bucket
    assert int(refused.headers["Retry-After"]) > 1
    context.close()


def test_a_tenant_admin_sees_their_tenant_and_nothing_of_another(
    ui_stack: Stack, browser: Browser, admin_password: str, screens: Screens
) -> None:
    password = secrets.token_urlsafe(12)
    context = context_new(browser, ui_stack)
    page = context.new_page()
    sign_in(page, "admin", admin_password)
    page.goto("/admin/auth/user/add/")
    page.fill("#id_username", "dana")
    page.fill("#id_password1", password)
    page.fill("#id_password2", password)
    save(page)
    page.goto("/admin/tenants/tenantmembership/add/")
    autocomplete_pick(page, "user", "dan", "dana")
    autocomplete_pick(page, "tenant", "glob", "globex")
    page.select_option("#id_role", "admin")
    screens.shot(page, "11-membership-add")
    save(page)
    context.close()

    [(acme,)] = ui_stack.sql("select id from tenants_tenant where name = 'acme'")
    [(globex,)] = ui_stack.sql("select id from tenants_tenant where name = 'globex'")
    context = context_new(browser, ui_stack)
    page = context.new_page()
    sign_in(page, "dana", password)
    page.goto("/admin/tenants/tenant/")
    assert page.locator("#result_list tbody th a").all_inner_texts() == ["globex"]
    screens.shot(page, "12-tenant-admin-tenants")
    # Autocomplete suggestions come from the server, scoped like every other list.
    page.goto("/admin/tenants/team/add/")
    page.click("#id_tenant + .select2 .select2-selection")
    page.fill(".select2-container--open .select2-search__field", "e")  # acme, globex, initech
    options = page.locator(".select2-container--open .select2-results__option")
    expect(options).to_have_text(["globex"])  # waits out "Searching…"
    screens.shot(page, "13-tenant-admin-autocomplete")
    assert page.goto(f"/admin/tenants/tenant/{globex}/change/").status == 200
    assert page.goto("/ops/tenants/globex/saturation/").status == 200
    assert page.goto("/ops/tenants/acme/saturation/").status == 404
    assert page.goto(f"/admin/tenants/tenant/{acme}/change/").status == 404
    screens.shot(page, "14-tenant-admin-other-tenant-404")
    context.close()


def test_the_saturation_page_charts_a_burst_of_requests(
    ui_stack: Stack, browser: Browser, admin_password: str, screens: Screens
) -> None:
    burst = 24
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: chat(ui_stack, ACME_KEY), range(burst)))
    assert [a.status_code for a in answers] == [200] * burst

    def served() -> int:
        [(count,)] = ui_stack.sql(
            "select count(*) from gateway_generation g join tenants_tenant t on t.id = g.tenant_id"
            " where t.name = 'acme' and g.status = 200"
        )
        return int(count)

    wait_until(lambda: served() >= burst, timeout=20, what="the burst in the ledger")

    for scheme in ("light", "dark"):
        context = context_new(browser, ui_stack, color_scheme=scheme)
        page = context.new_page()
        problems = problems_watch(page)
        sign_in(page, "admin", admin_password)
        page.goto("/ops/tenants/acme/saturation/")
        screens.shot(page, f"15-saturation-{scheme}")
        assert problems == []

        # Each bar segment's tooltip carries its value: the served bars add up to the ledger.
        tips = page.locator("#chart-requests rect title").all_text_contents()
        charted = sum(int(m.group(1)) for t in tips if (m := re.search(r"· served: (\d+)$", t)))
        assert charted == served()
        assert page.locator("#chart-tokens path").count() >= 2  # used and estimated
        assert page.locator("#chart-spend rect title").count() >= 1
        levels = page.locator("#levels tbody td:first-child code").all_inner_texts()
        assert "app:acme/search/web:concurrency" in levels
        # The page fits its width: wide tables scroll in their box, as the admin's lists do.
        assert page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]

        page.goto("/ops/tenants/acme/activity/")
        assert page.locator("#result_list tbody tr").count() >= burst
        screens.shot(page, f"16-activity-{scheme}")
        assert problems == []
        context.close()


def test_staff_give_a_model_an_alias_and_clients_are_served_by_it(
    ui_stack: Stack, browser: Browser, admin_password: str, screens: Screens
) -> None:
    context = context_new(browser, ui_stack)
    page = context.new_page()
    problems = problems_watch(page)
    sign_in(page, "admin", admin_password)
    page.goto("/admin/routing/model/?q=chat-small")
    page.click("#result_list tbody a >> text=acme/chat-small")
    page.fill("#id_aliases", "gpt-4o-mini, my-chat")
    screens.shot(page, "17-model-aliases")
    save(page)
    assert "gpt-4o-mini, my-chat" in page.locator("#result_list").inner_text()
    screens.shot(page, "18-model-aliases-listed")
    assert problems == []
    context.close()

    def by_alias() -> httpx.Response:
        return httpx.post(
            f"{ui_stack.base_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {ACME_KEY}"},
            json={"model": "my-chat", "messages": [{"role": "user", "content": "hello"}]},
            timeout=30,
        )

    # The save bumped the configuration version; each gateway worker reloads on its own.
    wait_until(lambda: by_alias().status_code == 200, timeout=10, what="the alias served")
    answer = by_alias()
    assert answer.headers["x-switchyard-provider"] in ("alpha", "gamma")
    models = httpx.get(
        f"{ui_stack.base_url}/v1/models", headers={"Authorization": f"Bearer {ACME_KEY}"}
    ).json()["data"]
    listed = {m["id"]: m.get("canonical_slug") for m in models}
    assert listed["my-chat"] == listed["gpt-4o-mini"] == "acme/chat-small"


def test_staff_add_a_project_and_a_key_to_a_providers_pool_on_its_page(
    ui_stack: Stack, browser: Browser, admin_password: str, screens: Screens
) -> None:
    """B2: the provider's page holds its projects and its key pool (inlines added by the
    admin's JavaScript); a key saved there is listed under its project, its secret not shown."""
    context = context_new(browser, ui_stack)
    page = context.new_page()
    problems = problems_watch(page)
    sign_in(page, "admin", admin_password)
    page.goto("/admin/routing/provider/?q=alpha")
    page.click("#result_list tbody a >> text=alpha")

    page.click("#projects-group .add-row a")
    page.locator("#projects-group tr.dynamic-projects").last.locator("input[name$='-name']").fill(
        "nightly-evals"
    )
    save(page, "_continue")

    page.click("#credentials-group .add-row a")
    row = page.locator("#credentials-group tr.dynamic-credentials").last
    row.locator("input[name$='-name']").fill("evals-key")
    row.locator("select[name$='-project']").select_option(label="alpha/nightly-evals")
    row.locator("input[name$='-api_key']").fill("sk-alpha-evals-0001")
    screens.shot(page, "19-provider-key-pool")
    # The limits inline (twelve columns) scrolls inside its box: the page fits the window.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    save(page)

    page.goto("/admin/routing/credential/?q=evals-key")
    listed = page.locator("#result_list").inner_text()
    screens.shot(page, "20-provider-keys-listed")
    assert "evals-key" in listed and "nightly-evals" in listed
    assert "sk-alpha-evals-0001" not in page.content()
    assert problems == []
    context.close()


def test_staff_see_a_tenants_batch_read_only(
    ui_stack: Stack, browser: Browser, admin_password: str, screens: Screens
) -> None:
    """E5: a batch submitted through the API is listed in the admin, which cannot add one."""
    auth = {"Authorization": f"Bearer {ACME_KEY}"}
    line = {
        "custom_id": "row-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "acme/chat-small", "messages": [{"role": "user", "content": "hi"}]},
    }
    uploaded = httpx.post(
        f"{ui_stack.base_url}/v1/files",
        headers=auth,
        data={"purpose": "batch"},
        files={"file": ("rows.jsonl", json.dumps(line).encode() + b"\n")},
        timeout=30,
    )
    assert uploaded.status_code == 200, uploaded.text
    batch = httpx.post(
        f"{ui_stack.base_url}/v1/batches",
        headers=auth,
        json={
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        timeout=30,
    )
    assert batch.status_code == 200, batch.text

    context = context_new(browser, ui_stack)
    page = context.new_page()
    problems = problems_watch(page)
    sign_in(page, "admin", admin_password)
    page.goto("/admin/gateway/batch/")
    listed = page.locator("#result_list").inner_text()
    screens.shot(page, "21-batches")
    assert batch.json()["id"] in listed and "acme" in listed
    assert re.search(r"\b[01] / 1\b", listed), listed  # lines done of its one line
    # Where it stands is in view without scrolling the table (the long id may need it).
    box = page.locator("#changelist .results").bounding_box()
    done = page.locator("#result_list th.column-progress").bounding_box()
    assert box and done and done["x"] + done["width"] <= box["x"] + box["width"]
    assert "Batches" in page.locator(".breadcrumbs").inner_text()  # not Django's "Batchs"
    assert page.locator("#content a.addlink").count() == 0  # the sidebar links aside
    assert problems == []
    context.close()
