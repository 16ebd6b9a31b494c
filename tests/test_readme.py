"""The README's configuration reference and commands say what the code does."""

from pathlib import Path

from pydantic import BaseModel

from vesper.common.config import VesperConfig

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _keys(model: type[BaseModel], prefix: str) -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        nested = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if nested is None and getattr(annotation, "__args__", None):
            nested = next((a for a in annotation.__args__ if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if nested is not None:
            keys += _keys(nested, f"{prefix}.{name}" if prefix else name)
        else:
            keys.append(f"{prefix}.{name}" if prefix else name)
    return keys


def test_every_config_key_is_documented() -> None:
    missing = [key for key in _keys(VesperConfig, "") if f"`{key}`" not in README]
    assert not missing, f"README's configuration reference lacks: {missing}"


def test_the_two_setup_commands_are_in_the_readme() -> None:
    assert "make demo" in README and "make test" in README
