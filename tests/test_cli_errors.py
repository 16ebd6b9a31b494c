"""The command's errors print their message exactly: TOML section names are not rich markup."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from vesper.coordinator.cli import app


def _squeezed(text: str) -> str:
    return "".join(text.split())


def test_an_error_naming_a_toml_section_keeps_its_brackets(tmp_path: Path) -> None:
    config = tmp_path / "only-b.toml"
    config.write_text('[party_b]\nlisten = "127.0.0.1:0"\n')
    result = CliRunner().invoke(app, ["serve", "accountant", "--config", str(config)])
    assert result.exit_code == 2
    # the console wraps long lines, at a space or inside the temporary path: compare without whitespace
    assert _squeezed(f"{config} has no [accountant] section") in _squeezed(result.output)


def test_demo_refuses_an_unknown_log_format_before_starting_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--log-format", "yaml", "--workdir", str(tmp_path / "demo")])
    assert result.exit_code == 2
    assert _squeezed("--log-format must be one of text, json, got 'yaml'") in _squeezed(result.output)
    assert not (tmp_path / "demo").exists()
