"""The committed generated code is exactly what the .proto files compile to."""

from vesper.proto import generate


def test_generated_code_is_up_to_date() -> None:
    stale = generate.stale_files()
    assert not stale, f"regenerate with `python -m vesper.proto.generate`: {stale}"


def test_check_fails_when_a_generated_file_is_edited(tmp_path, monkeypatch) -> None:
    # a copy of the proto folder with one generated file tampered with
    import shutil

    copy = tmp_path / "v1"
    shutil.copytree(generate.PROTO_DIR, copy)
    target = copy / "tensor_pb2.py"
    target.write_text(target.read_text() + "\n# edited by hand\n")
    monkeypatch.setattr(generate, "PROTO_DIR", copy)
    assert generate.stale_files() == ["tensor_pb2.py"]
    assert generate.main(["--check"]) == 1
