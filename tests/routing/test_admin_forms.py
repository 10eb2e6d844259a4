"""The admin edits every setting a route model has: a field added to the model but not to the
admin's form would be settable from the config file only, with nothing on the page to say so."""

from routing.admin import RouteModelForm
from routing.models import Model


def test_the_route_model_form_edits_every_editable_field_of_the_model():
    editable = {
        f.name
        for f in Model._meta.get_fields()
        if f.concrete and not f.auto_created and getattr(f, "editable", False)
    }

    assert "max_cost_premium" in editable  # the set is the model's, not empty
    assert editable - set(RouteModelForm.base_fields) == set()
