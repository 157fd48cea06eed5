"""Specs and data registry: validation, provenance, clear errors."""
import shutil

import pytest

from analysis import data, roofline, specs


def test_unknown_model_lists_close_matches():
    with pytest.raises(specs.UnknownNameError) as e:
        specs.model("Llama-3.1-7OB")
    assert "Llama-3.1-70B" in str(e.value) and "Allowed" in str(e.value)


def test_unknown_gpu():
    with pytest.raises(specs.UnknownNameError, match="unknown gpu 'H1000'"):
        specs.gpu("H1000")


def test_models_have_required_fields_and_provenance():
    names = set(specs.model_names())
    required = {"GPT-2 small", "GPT-2 XL", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B",
                "Mixtral-8x7B", "Qwen3-235B-A22B", "DeepSeek-V3", "Kimi-K2", "Kimi-Linear-48B-A3B",
                "Gemma-3-27B", "gpt-oss-120b", "SmolLM2-135M"}
    assert required <= names
    for m in specs.models():
        assert m.source.startswith("http") and m.date[:2] in ("20",)


def test_gpu_values_in_si():
    h100 = specs.gpu("H100-SXM5-80GB")
    assert h100["hbm_capacity"] == 80e9 and h100["hbm_bandwidth"] == 3.35e12
    assert h100.flops("fp8") == pytest.approx(2 * h100.flops("bf16"), rel=1e-3)
    assert h100["rent"] == pytest.approx(2.2 / 3600)


def test_negative_bandwidth_is_rejected():
    with pytest.raises(specs.SpecError, match="finite number >= 0"):
        specs.gpu("H100-SXM5-80GB").replace(hbm_bandwidth=-1.0)
    with pytest.raises(ValueError, match="bandwidth must be finite and > 0"):
        roofline.op_time(1e9, 1e9, 1e12, -5.0)


def test_inconsistent_model_row_names_field():
    with pytest.raises(specs.SpecError, match="n_kv_heads"):
        specs.model("Llama-3.1-8B").replace(n_kv_heads=5)
    with pytest.raises(specs.SpecError, match="n_sliding_layers"):
        specs.model("Llama-3.1-8B").replace(n_sliding_layers=40, sliding_window=10)


def test_registry_resolves_and_verifies():
    p = data.path("mooncake_conversation")
    assert p.is_file() and data.sha256(p) == data.registry()["mooncake_conversation"]["sha256"]


def test_corrupt_file_is_an_error(tmp_path, monkeypatch):
    mirror = data.registry()["mooncake_conversation"]["mirror"]
    bad = tmp_path / mirror
    bad.parent.mkdir(parents=True)
    bad.write_text('{"timestamp": 0}\n')
    monkeypatch.setenv("KVBOOK_DATA", str(tmp_path))
    with pytest.raises(data.DataError, match="corrupt or a different version"):
        data.path("mooncake_conversation")


def test_missing_file_says_how_to_obtain(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "EXTERNAL_DIR", tmp_path / "ext")
    monkeypatch.setattr(data, "SHARED_MIRROR", tmp_path / "none")
    monkeypatch.delenv("KVBOOK_DATA", raising=False)
    monkeypatch.setenv("KVBOOK_OFFLINE", "1")
    with pytest.raises(data.DataError) as e:
        data.path("mooncake_conversation")
    msg = str(e.value)
    assert "raw.githubusercontent.com/kvcache-ai/Mooncake" in msg and "KVBOOK_DATA" in msg and "sha256" in msg


def test_unknown_registry_name():
    with pytest.raises(data.DataError, match="registered files"):
        data.path("nope")


def test_table_requires_provenance(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text("a,source,date\n1,x,2026-01-01\n2,,2026-01-01\n")
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    with pytest.raises(data.DataError, match=r"rows on lines 3 have no 'source'"):
        data.table("t.csv")


def test_corrupt_hardware_table(tmp_path, monkeypatch):
    shutil.copy(data.DATA_DIR / "hardware.csv", tmp_path / "hardware.csv")
    with open(tmp_path / "hardware.csv", "a") as fh:
        fh.write("X1,gpu,hbm_bandwidth,-3,TB/s,somewhere,2026-01-01,0,\n")
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    specs._hardware.cache_clear()
    try:
        n_lines = len((tmp_path / "hardware.csv").read_text().splitlines())  # comment lines counted
        with pytest.raises(specs.SpecError, match=rf"hardware.csv:{n_lines}: .* must be finite and >= 0"):
            specs.gpu("X1")
    finally:
        specs._hardware.cache_clear()


def test_published_figures_carry_source():
    row = data.published("mooncake_llama3_70b_kv_per_token")
    assert row["value"] == 320 and "Mooncake" in row["source"]
    with pytest.raises(data.DataError, match="no published figure"):
        data.published("nope")


def test_fetch_all_says_where_each_file_is_and_fails_per_missing_file(tmp_path, monkeypatch, capsys):
    """`make data`: every registered file resolved and verified; a missing one named, the others kept."""
    import hashlib

    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "a.csv").write_text("x\n1\n")
    fake = {"present": {"mirror": "a.csv", "sha256": hashlib.sha256(b"x\n1\n").hexdigest(), "url": "u1",
                        "licence": "MIT", "source": "s"},
            "absent": {"mirror": "b.csv", "sha256": "0" * 64, "url": "https://example.org/b.csv",
                       "licence": "MIT", "source": "s"}}
    monkeypatch.setattr(data, "registry", lambda: fake)
    monkeypatch.setattr(data, "EXTERNAL_DIR", tmp_path / "ext")
    monkeypatch.setattr(data, "SHARED_MIRROR", tmp_path / "none")
    monkeypatch.setenv("KVBOOK_DATA", str(tmp_path / "here"))
    monkeypatch.setenv("KVBOOK_OFFLINE", "1")
    assert data.main(["--fetch-all"]) == 1
    out = capsys.readouterr().out
    assert f"ok       present: {tmp_path / 'here' / 'a.csv'} (sha256 verified)" in out
    assert "MISSING  absent: data file 'absent' not found" in out and "https://example.org/b.csv" in out
    assert "1 of 2 registered files present and verified; missing: absent" in out
    res = data.fetch_all()
    assert isinstance(res["absent"], data.DataError) and res["present"] == tmp_path / "here" / "a.csv"


def test_content_id_follows_content_not_name(tmp_path, monkeypatch):
    f = tmp_path / "trace.jsonl"
    f.write_text('{"timestamp": 0}\n')
    a = data.content_id(f)
    f.write_text('{"timestamp": 1}\n')  # same name, other content: another id
    assert data.content_id(str(f)) != a
    reg = data.registry()["mooncake_conversation"]
    assert data.content_id("mooncake_conversation") == reg["sha256"]
    with pytest.raises(data.DataError, match="neither a registered name"):
        data.content_id(tmp_path / "nope.jsonl")


def test_hash_inside_a_field_is_data_and_lines_count_comments(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text("# a comment\n#another\nname,notes,source,date\n"
                                    "a,see PR #28068 and #1,x,2026-01-01\n\n# between rows\n"
                                    'b,"two\n# not a comment: inside quotes",y,2026-01-02\n')
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    df = data.table("t.csv")
    assert list(df["notes"]) == ["see PR #28068 and #1", "two\n# not a comment: inside quotes"]
    assert data.where(df, 0).endswith("t.csv:4") and data.where(df, 1).endswith("t.csv:7")
    (tmp_path / "u.csv").write_text("#c\nname,source,date\na,x,2026\nb,,2026\n")
    with pytest.raises(data.DataError, match=r"rows on lines 4 have no 'source'"):
        data.table("u.csv")


def test_models_table_keeps_notes_whole():
    notes = data.table("models.csv").set_index("name").loc["Mixtral-8x7B", "notes"]
    assert "PR #28068 (sliding window removed" in notes and "PR #29436" in notes


def test_integer_field_rejects_a_fraction_naming_line_model_and_field(tmp_path, monkeypatch):
    lines = (data.DATA_DIR / "models.csv").read_text().splitlines(keepends=True)
    header = next(ln for ln in lines if not ln.startswith("#")).strip().split(",")
    col = header.index("n_layers")
    n = next(i for i, ln in enumerate(lines, 1) if ln.startswith("Llama-3.1-8B,"))
    fields = lines[n - 1].split(",")
    fields[col] = "8.5"
    lines[n - 1] = ",".join(fields)
    (tmp_path / "models.csv").write_text("".join(lines))
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    specs._models.cache_clear()
    try:
        msg = rf"models.csv:{n} \(model 'Llama-3.1-8B'\): n_layers = 8.5 is not an integer"
        with pytest.raises(specs.SpecError, match=msg):
            specs.model("Llama-3.1-8B")
    finally:
        specs._models.cache_clear()
    assert specs._as_int(8.0) == 8 and specs._as_int("") == 0
    with pytest.raises(specs.SpecError, match="x = 'abc' is not an integer"):
        specs._as_int("abc", "f:1", "x")
