"""Settings named by a dotted path (common/dotted_settings.py): set before validation, and
told apart from a default after."""

from vesper.common.config import RunConfig
from vesper.common.dotted_settings import is_set, set_dotted


def test_set_dotted_creates_the_sections_on_its_path() -> None:
    data: dict = {"privacy": {"epsilon": 4.0}}
    set_dotted(data, "privacy.edge_bound", 6000)
    set_dotted(data, "extractor.params.hops", 2)
    assert data == {"privacy": {"epsilon": 4.0, "edge_bound": 6000}, "extractor": {"params": {"hops": 2}}}


def test_is_set_tells_a_given_setting_from_a_default() -> None:
    given = RunConfig.model_validate({"dataset": "cora", "extractor": {"name": "gap"}, "privacy": {"epsilon": 4.0}})
    assert is_set(given, "extractor.name") and is_set(given, "privacy.epsilon")
    assert not is_set(given, "privacy.edge_bound")  # its section was given, the key was not
    assert not is_set(given, "optimizer.lr")  # neither was its section
    assert given.optimizer.lr == 0.01  # though the default fills it
    bare = RunConfig.model_validate({"dataset": "cora"})
    assert not is_set(bare, "extractor.name") and bare.extractor.name == "gap"
