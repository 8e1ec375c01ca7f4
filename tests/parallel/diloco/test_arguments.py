"""Bad DiLoCo arguments raise at construction, with a message that names the fix."""
import pytest

from minidist.nn import Linear
from minidist.optim import SGD, AdamW
from minidist.parallel.diloco import DiLoCo

from parallel.diloco.diloco_cases import case_of, fragments_of, make_model


def build(**kw):
    model = make_model(case_of())
    inner = AdamW(model.parameters(), lr=1e-3)
    outer = SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    args = dict(sync_every=4)
    args.update(kw)
    if callable(args.get("fragments")):
        args["fragments"] = args["fragments"](model)
    if callable(args.get("outer")):
        outer = args.pop("outer")(model)
    return DiLoCo(model, inner, outer, **args)


@pytest.mark.parametrize("kw, message", [
    (dict(sync_every=0), "sync_every must be an int >= 1"),
    (dict(sync_every=5, fragments=lambda m: fragments_of(m, 2)), "use sync_every = 4 or 6"),
    (dict(fragments=lambda m: [[m.fc1], [m.fc2]]), r"\['fc3.weight', 'fc3.bias'\] are in no "
                                                   "fragment"),
    (dict(fragments=lambda m: [[m.fc1, m.fc2], [m.fc2, m.fc3]]),
     "in fragments 0 and 1: each parameter must be in exactly one"),
    (dict(fragments=lambda m: [[m.fc1, m.fc2, m.fc3], [Linear(2, 2)]]), "not the model's"),
    (dict(fragments=lambda m: fragments_of(m, 2), fragment_sync_delay=2),
     "fragment_sync_delay = 2 must be < sync_every / fragments = 2"),
    (dict(fragment_update_alpha=1.5), r"fragment_update_alpha must lie in \[0, 1\]"),
    (dict(outer=lambda m: SGD(list(m.parameters())[:2], lr=0.7)),
     r"outer optimizer must hold exactly the model's parameters \(0 not the model's, 4"),
    (dict(outer=lambda m: SGD(list(m.parameters()) + list(Linear(2, 2).parameters()), lr=1)),
     r"2 not the model's, 0 of the model's trainable ones missing.*OuterOpt\(model.parameters\(\)"),
    (dict(outer_grad_format="fp3"), "unknown outer_grad_format 'fp3'; use None"),
    (dict(outer_grad_format="e8m0"), "has no sign bit"),
])
def test_bad_arguments_raise_naming_the_fix(kw, message):
    with pytest.raises(ValueError, match=message):
        build(**kw)

