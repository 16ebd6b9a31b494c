"""Extractors installed on this machine, found through the ``vesper.extractors`` entry points.

A third party adds a method by installing a package that declares, in its
pyproject.toml::

    [project.entry-points."vesper.extractors"]
    my-method = "my_package.module:MyExtractor"

The entry point's name must equal ``MyExtractor.spec.name``. Nothing is imported until
a method is asked for, and a plugin that fails to import is reported, not fatal to the
others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import BaseModel, ValidationError

from vesper.common.config import RunConfig
from vesper.common.dotted_settings import is_set, set_dotted
from vesper.party_a.extractors.base import Extractor, ExtractorSpec

GROUP = "vesper.extractors"


class ExtractorNotFound(ValueError):
    """The run names an extractor this party A does not have, or one that cannot load."""


@dataclass(frozen=True)
class Installed:
    name: str
    source: str  # "module:attr" of the entry point
    distribution: str
    extractor: type[Extractor] | None
    error: str = ""


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=GROUP):
        found.setdefault(point.name, point)  # first on sys.path wins, as for imports
    return found


def _load(point: EntryPoint) -> Installed:
    distribution = point.dist.name if point.dist is not None else "?"
    try:
        cls = point.load()
    except Exception as exc:  # a broken third-party plugin must not hide the others
        return Installed(point.name, point.value, distribution, None, f"cannot import: {exc!r}")
    spec = getattr(cls, "spec", None)
    if not isinstance(spec, ExtractorSpec):
        return Installed(point.name, point.value, distribution, None, "has no ExtractorSpec `spec` attribute")
    if spec.name != point.name:
        return Installed(
            point.name, point.value, distribution, None,
            f"is registered as {point.name!r} but its spec says {spec.name!r}",
        )
    return Installed(point.name, point.value, distribution, cls)


def installed() -> list[Installed]:
    """Every registered extractor, loaded, sorted by name (broken ones carry their error)."""
    return [_load(point) for _, point in sorted(_entry_points().items())]


def lookup(name: str) -> type[Extractor]:
    point = _entry_points().get(name)
    if point is None:
        known = ", ".join(sorted(_entry_points())) or "none"
        raise ExtractorNotFound(f"unknown extractor {name!r}; installed on party A: {known}")
    found = _load(point)
    if found.extractor is None:
        raise ExtractorNotFound(f"extractor {name!r} ({found.source}) {found.error}")
    return found.extractor


def validated_params(spec: ExtractorSpec, config: RunConfig) -> BaseModel:
    """extractor.params checked against the method's model; refuses modes it does not support."""
    privacy = config.privacy
    if privacy.accounting not in spec.accountings:
        raise ValueError(
            f"extractor {spec.name} supports accounting {', '.join(spec.accountings)}, not {privacy.accounting}"
        )
    if privacy.accountant not in spec.accountants:
        raise ValueError(
            f"extractor {spec.name}'s releases can be accounted by {', '.join(spec.accountants)} only, "
            f"not by privacy.accountant={privacy.accountant}"
        )
    if privacy.edge_sample_rate is not None and not spec.edge_sampling:
        raise ValueError(f"extractor {spec.name} does not support privacy.edge_sample_rate")
    try:
        return spec.params.model_validate(config.extractor.params)
    except ValidationError as exc:
        problems = "; ".join(
            f"extractor.params.{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise ValueError(f"bad parameters for extractor {spec.name}: {problems}") from None


@dataclass(frozen=True)
class AppliedDefaults:
    """What a run took from its extractor: ``own``, the extractor's ``run_defaults`` the run did
    not set itself (or a benchmark's recipe standing for them), and ``path``, the edge-free path's
    settings recorded with them where they narrowed the run (:func:`path_as_baseline`)."""

    own: dict[str, Any] = field(default_factory=dict)
    path: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, Any]:
        """Every dotted setting to write into the run's config."""
        return {**self.own, **self.path}


def defaults_to_apply(config: RunConfig, own: dict[str, Any]) -> AppliedDefaults:
    """``own`` and the edge-free path's settings that go with it, for the run ``config`` (its
    settings before the defaults: what it set itself wins)."""
    return AppliedDefaults(dict(own), path_as_baseline(config, own) if own else {})


def with_run_defaults(config: RunConfig) -> tuple[RunConfig, AppliedDefaults]:
    """``config`` with its extractor's ``run_defaults`` for every setting the run did not set
    itself (a TOML key or a flag: pydantic's fields set), and what was applied; where they
    narrowed the run, its edge-free path keeps the MLP baseline's (:func:`path_as_baseline`)."""
    defaults = lookup(config.extractor.name).spec.run_defaults
    applied = defaults_to_apply(config, {k: v for k, v in defaults.items() if not is_set(config, k)})
    if not applied.own:
        return config, applied
    data = config.model_dump(mode="json", exclude_unset=True)
    for dotted, value in applied.settings.items():
        set_dotted(data, dotted, value)
    return RunConfig.model_validate(data), applied


def path_defaults(name: str) -> dict[str, Any]:
    """The edge-free path's settings a run of extractor ``name`` records when it sets nothing
    itself (for ``vesper extractors``; none where its declared defaults do not validate)."""
    try:
        return with_run_defaults(RunConfig.model_validate({"extractor": {"name": name}}))[1].path
    except ValueError:  # pydantic's ValidationError included: the listing still lists it
        return {}


# the run settings an extractor's defaults may change that the edge-free path has a key of its own for
_PATH_KEYS = {"extractor.layers": "extractor.edge_free_path_layers", "extractor.dim": "extractor.edge_free_path_dim"}


def path_as_baseline(config: RunConfig, applied: dict[str, Any]) -> dict[str, Any]:
    """The edge-free path's layers and width as the MLP baseline's, where the extractor's own
    defaults (``applied``) changed the run's: the path is then the ``mlp`` run of the settings the
    run gave (party_a.extractors.edge_free_path). ``config`` is the run's before its defaults. A
    width that is not a multiple of the run's stays the run's (the path's slices are the run's width)."""
    from vesper.party_a.extractors.edge_free_path import carries_path

    try:
        cls = lookup(config.extractor.name)
    except ExtractorNotFound:  # a run of it fails in its set-up, saying so; a path of it has no settings
        return {}
    if not carries_path(cls, config):  # no path (turned off, node-level, the MLP)
        return {}
    baseline = lookup("mlp").spec.run_defaults
    keys: dict[str, Any] = {}
    for run_key, path_key in _PATH_KEYS.items():
        if run_key not in applied or is_set(config, path_key):
            continue
        own = baseline.get(run_key, getattr(config.extractor, run_key.split(".")[1]))
        if own == applied[run_key] or (run_key == "extractor.dim" and own % applied[run_key]):
            continue
        keys[path_key] = own
    return keys


def describe_params(model: type[BaseModel]) -> list[tuple[str, str, str]]:
    """(name, default, description) of each hyper-parameter, for ``vesper extractors``."""
    rows = []
    for name, info in model.model_fields.items():
        default = "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
        rows.append((name, default, info.description or ""))
    return rows
