"""The measured operator backend (analysis.measured, issue 27 item 1): AIConfigurator's silicon tables
read once, interpolated log-log between the measured points, the roofline where they have no entry
(with a recorded reason), a clear error naming a missing or corrupt table file, and the measured share
of a plan's time in :func:`analysis.forward.ledger`."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import forward as fw
from analysis import measured as M
from analysis import specs

GPU, FOLDER = "H200-SXM-141GB", "h200_sxm"
EFF = fw.Efficiency()


@pytest.fixture(scope="module")
def gemm_rows():
    t = M.table(FOLDER, "gemm")
    df = pd.read_parquet(t.path)
    return df[df["gemm_dtype"] == "bfloat16"]


def _gemm_op(m, n, k, dtype="bf16"):
    g = specs.gpu(GPU)
    m, n, k = (np.asarray(x, dtype=float) for x in (m, n, k))
    return fw.Op("gemm", {"m": m, "n": n, "k": k}, 2.0 * m * n * k, 2.0 * (m * k + n * k + m * n),
                 g.flops("bf16"), g["hbm_bandwidth"], dtype=dtype)


def test_every_gpu_of_the_hardware_table_is_mapped_to_a_package_folder():
    assert set(specs.hardware_names("gpu")) == set(M.DEVICE_TABLES)
    for dev, (folder, comm, note) in M.DEVICE_TABLES.items():
        for kind in M.TABLE_KINDS:  # every table the backend reads exists for every mapped GPU
            if kind in ("deepep_ll", "moe_wideep"):  # SGLang's wide-EP tables: some GPUs only
                if kind == "deepep_ll" and folder in M.DEEPEP_FOLDERS:
                    assert M.table_path(folder, kind, M.DEEPEP_FRAMEWORK).is_file(), (dev, kind)
                continue
            assert M.table_path(folder, kind).is_file(), (dev, kind)
        assert comm or ("own links" in note), dev  # a chip measured on another's links says so
    assert M.DEVICE_TABLES["H800-SXM5-80GB"][:2] == ("h100_sxm", False)
    assert M.package_version() == M.PACKAGE_VERSION


def test_tables_are_read_once_and_record_framework_and_version():
    a = M.table(FOLDER, "gemm")
    assert M.table(FOLDER, "gemm") is a  # cached: read once per process
    rec = [r for r in M.tables_used() if r["gpu"] == FOLDER and r["kind"] == "gemm"]
    assert rec and rec[0]["framework"] == "TRTLLM" and rec[0]["version"] == a.path.parent.name
    assert rec[0]["file"].endswith("gemm_perf.parquet") and "bfloat16" in rec[0]["keys"]


def test_interpolation_reproduces_every_table_point(gemm_rows):
    sec, code = M.gemm_seconds(FOLDER, gemm_rows["m"], gemm_rows["n"], gemm_rows["k"])
    assert np.all(code == 0)
    np.testing.assert_allclose(sec, gemm_rows["latency"].to_numpy() * 1e-3, rtol=1e-12)
    ar = pd.read_parquet(M.table(FOLDER, "allreduce").path)
    s, c = M.allreduce_seconds(FOLDER, ar["message_size"], ar["num_gpus"])
    assert np.all(c == 0)
    np.testing.assert_allclose(s, ar["latency"].to_numpy() * 1e-3, rtol=1e-12)


def test_between_points_the_interpolation_is_log_log_linear(gemm_rows):
    """Between two measured m (fixed n, k) the time is the geometric interpolation of the two; a
    nearest-point or roofline answer fails here."""
    x = gemm_rows[(gemm_rows["n"] == 4096) & (gemm_rows["k"] == 4096)].sort_values("m")
    m0, m1 = 257, 512  # adjacent measured m
    t0, t1 = (float(x.loc[x["m"] == m, "latency"].iloc[0]) * 1e-3 for m in (m0, m1))
    assert t0 != t1
    for f in (0.25, 0.5, 0.8):
        m = m0 * (m1 / m0) ** f
        want = t0 ** (1 - f) * t1 ** f
        got, code = M.gemm_seconds(FOLDER, m, 4096, 4096)
        assert code == 0 and float(got) == pytest.approx(want, rel=1e-9)
    # n between two measured values (m, k on the grid): the same rule along n
    y = gemm_rows[(gemm_rows["m"] == 1024) & (gemm_rows["k"] == 4096)].set_index("n")["latency"] * 1e-3
    got, _ = M.gemm_seconds(FOLDER, 1024, np.sqrt(4096 * 5120), 4096)
    assert float(got) == pytest.approx(np.sqrt(y[4096] * y[5120]), rel=1e-9)


def test_monotone_in_m_where_the_table_is(gemm_rows):
    x = gemm_rows[(gemm_rows["n"] == 8192) & (gemm_rows["k"] == 8192)].sort_values("m")
    m, t = x["m"].to_numpy(), x["latency"].to_numpy()
    checked = 0
    for i in range(len(m) - 1):
        if t[i + 1] >= t[i]:
            q = np.geomspace(m[i], m[i + 1], 17)
            s, _ = M.gemm_seconds(FOLDER, q, 8192, 8192)
            assert np.all(np.diff(s) >= -1e-12 * s[:-1]), (m[i], m[i + 1])  # equal ends: rounding only
            checked += 1
    assert checked > 20


def test_vectorised_over_plans():
    m = np.array([[1.0, 64.0, 1000.0], [4096.0, 20000.0, 1e6]])
    s, c = M.gemm_seconds(FOLDER, m, np.array([[4096.0], [1536.0]]), 4096)
    assert s.shape == c.shape == (2, 3)
    assert list(c.ravel()) == [0, 0, 0, 0, 0, 5] and np.isnan(s[1, 2])


def test_out_of_range_and_uncovered_shapes_fall_back_to_the_roofline_with_a_reason():
    name = M.backend_name(GPU)
    op = _gemm_op([128.0, 1e6, 128.0], [4096.0, 4096.0, 1e6], 4096.0)  # m, then n, past the table
    roof, _ = fw.roofline_backend(op, EFF)
    with M.fallbacks() as fb, fw.ledger() as led:
        t = fw.price(op, EFF, name)
    np.testing.assert_allclose(t[1:], roof[1:], rtol=1e-12)
    assert t[0] != pytest.approx(roof[0]) and list(led.measured_share) == [1.0, 0.0, 0.0]
    [(key, (sec, count))] = fb.by_reason.items()
    assert key == (GPU, "gemm", M.REASONS[5]) and count == 2 and sec == pytest.approx(roof[1] + roof[2])
    # a dtype without a table, and an operator kind with none
    with M.fallbacks() as fb:
        fw.price(_gemm_op(128.0, 4096.0, 4096.0, dtype="fp4"), EFF, name)
        att = fw.Op("attention", {"batch": 8.0}, 1e9, 1e8, 989e12, 4.8e12)
        assert fw.price(att, EFF, name) == pytest.approx(fw.roofline_backend(att, EFF)[0])
    reasons = {k[2] for k in fb.by_reason}
    assert M.REASONS[4] in reasons and any(r.startswith("attention:") for r in reasons)


def test_unknown_devices_and_other_chips_links_fall_back_with_reason():
    npu = M.backend_name("NPU-1000T-64G")  # chapter 3's NPU design points have no tables
    op = _gemm_op(128.0, 4096.0, 4096.0)
    with M.fallbacks() as fb:
        assert fw.price(op, EFF, npu) == pytest.approx(fw.roofline_backend(op, EFF)[0])
    assert list(fb.by_reason) == [("NPU-1000T-64G", "gemm", "no table for this device (NPU-1000T-64G)")]
    # H800: H100's compute tables, its own (slower) links for communication
    h800 = M.backend_name("H800-SXM5-80GB")
    ar = fw.Op("allreduce", {"bytes": 1e6, "n": 8.0}, bytes_=1e6, wire_s=1.2345e-4)
    with M.fallbacks() as fb:
        assert fw.price(ar, EFF, h800) == pytest.approx(1.2345e-4)
        g, _ = fw.get_backend(h800)(op, EFF)
    [key] = fb.by_reason
    assert key[1] == "allreduce" and "H800" in key[2] and "own links" in key[2]
    want, _ = M.gemm_seconds("h100_sxm", 128.0, 4096.0, 4096.0)
    assert g == pytest.approx(float(want), rel=1e-12)
    # a GPU count the all-reduce table did not measure; one GPU is no operator at all
    s, c = M.allreduce_seconds(FOLDER, 1e6, [1.0, 3.0, 16.0, 8.0])
    assert list(c) == [M.NO_OP, 7, 7, 0] and s[0] == 0.0


def test_measured_share_of_a_plan_mixing_covered_and_uncovered_operators():
    name = M.backend_name(GPU)
    gemm = _gemm_op([256.0, 512.0], 4096.0, 4096.0)
    att = fw.Op("attention", {"batch": 8.0}, np.array([2e11, 4e11]), 1e9, 989e12, 4.8e12)
    with fw.ledger() as led:
        tg = fw.price(gemm, EFF, name, count=32)
        ta = fw.price(att, EFF, name, count=32)
    want, _ = M.gemm_seconds(FOLDER, [256.0, 512.0], 4096.0, 4096.0)
    np.testing.assert_allclose(tg, 32 * want, rtol=1e-12)
    np.testing.assert_allclose(led.measured_share, tg / (tg + ta), rtol=1e-12)
    # a whole forward pass: the share is the table-priced operators' seconds over the pass's
    s = fw.shape("Llama-3.1-8B")
    with fw.ledger() as led, M.fallbacks() as fb:
        fw.colocated_pass_time(s, fw.Precision(), EFF, M.device(GPU), tp=np.array([1.0, 2.0, 8.0]),
                               dec_seqs=64.0, dec_ctx=4096.0)
    share = np.asarray(led.measured_share)
    assert share.shape == (3,) and np.all((share > 0) & (share < 1))
    assert ("H200-SXM-141GB", "gemm") in fb.measured and ("H200-SXM-141GB", "allreduce") in fb.measured
    with fw.ledger() as roof:
        fw.colocated_pass_time(s, fw.Precision(), EFF, fw.instance_device(GPU), tp=np.array([1.0, 2.0, 8.0]),
                               dec_seqs=64.0, dec_ctx=4096.0)
    assert np.all(np.asarray(roof.measured_share) == 0)  # the default stays the roofline


def test_a_missing_or_corrupt_table_is_an_error_naming_the_file(tmp_path):
    src = M.table(FOLDER, "gemm").path
    d = tmp_path / "h200_sxm" / "gemm" / "trtllm" / "9.9.9"
    d.mkdir(parents=True)
    bad = d / "gemm_perf.parquet"
    shutil.copy(src, bad)
    bad.write_bytes(bad.read_bytes()[: 4096])  # truncated: corrupt
    assert M.table_path("h200_sxm", "gemm", root=tmp_path) == bad
    with pytest.raises(M.TableError, match=str(bad)):
        M.load(bad, "gemm")
    pd.DataFrame({"m": [1], "latency": [0.1]}).to_parquet(bad)  # readable, wrong columns
    with pytest.raises(M.TableError, match=rf"{bad}.*lacks the columns"):
        M.load(bad, "gemm")
    bad.unlink()
    with pytest.raises(M.TableError, match=str(bad)):
        M.load(bad, "gemm")
    with pytest.raises(M.TableError, match=str(tmp_path / "h200_sxm" / "gemm" / "trtllm")):
        M.table_path("h200_sxm", "gemm", root=tmp_path)



def test_only_chapter_3_uses_the_measured_backend():
    """Chapter 3 prices claims (a)-(c) with the measured backend (issue 27 item 5: its ratio sweep,
    PD-gain sweeps and ablation with ``backend="measured"``); every other chapter keeps the roofline.
    The modules that import this one are the production cells' (``decode_throughput(backend=...)``),
    the chapter's experiments (``study.measured_hardware``) and page functions (``chapter``: the
    leave-one-shape-out check of the MoE fallback), the revalidation's reading of the MoE table at two
    expert splits (``revalidate.moe_split_kernel_values``, a stated comparison, no plan priced by it)
    and the validation's (``validate``: the measured slowdown of tensor-split experts,
    ``measured.moe_split_slowdown``, scales the roofline's routed experts of those runs; with
    ``backend="measured"`` the whole validation is priced from the tables, which chapter 3's evidence
    page compares with the roofline's); a chapter that adopts it updates this test."""
    from tests.test_layers import graph

    users = sorted(m for m, targets in graph().items() if "analysis.measured" in targets)
    assert users == ["analysis.disagg.chapter", "analysis.disagg.production", "analysis.disagg.revalidate",
                     "analysis.disagg.study", "analysis.disagg.validate"]
    pages = sorted((Path(__file__).resolve().parent.parent / "book").glob("*.md"))
    # an import of the backend, its device helper, or a backend argument naming it (not the word
    # 'measured' as such: chapter 5 keeps chapter 4's measurements under the key "measured")
    uses = re.compile(r"measured import|import measured|import analysis\.measured|measured_device"
                      r"|backend\s*=\s*[\"']measured[\"']")
    assert pages and [p.name for p in pages if uses.search(p.read_text())] == ["03_disagg.md",
                                                                             "03_disagg_evidence.md"]


def test_attention_from_the_generation_and_context_tables_when_the_op_carries_heads():
    gen = pd.read_parquet(M.table(FOLDER, "generation_attention").path)
    x = gen[(gen["num_heads"] == 32) & (gen["num_key_value_heads"] == 8) & (gen["head_dim"] == 128)
            & (gen["window_size"] == 0) & (gen["kv_cache_dtype"] == "bfloat16")].head(50)
    b, step = x["batch_size"].to_numpy(float), x["step"].to_numpy(float)
    sec, code = M.attention_seconds(FOLDER, b, b, b * step, 32, 8, 128)  # decode: one token per sequence
    assert np.all(code == 0)
    np.testing.assert_allclose(sec, x["latency"].to_numpy() * 1e-3, rtol=1e-12)
    ctx = pd.read_parquet(M.table(FOLDER, "context_attention").path)
    y = ctx[(ctx["num_heads"] == 32) & (ctx["num_key_value_heads"] == 8) & (ctx["head_dim"] == 128)
            & (ctx["window_size"] == 0) & (ctx["kv_cache_dtype"] == "bfloat16")
            & (ctx["attn_dtype"] == "bfloat16") & (ctx["isl"] > 1)].head(50)
    b, isl = y["batch_size"].to_numpy(float), y["isl"].to_numpy(float)
    sec, code = M.attention_seconds(FOLDER, b, b * isl, 0.0, 32, 8, 128)
    assert np.all(code == 0)
    np.testing.assert_allclose(sec, y["latency"].to_numpy() * 1e-3, rtol=1e-12)
    # through the backend: a decode plan measured, a mixed pass, an unmeasured head count and MLA not
    name = M.backend_name(GPU)
    shape = {"batch": np.array([32.0, 32.0, 32.0]), "tokens": np.array([32.0, 544.0, 32.0]),
             "kv_tokens": np.array([32 * 4095.0, 32 * 4095.0, 32 * 4095.0]), "kv_heads": 8.0,
             "heads": np.array([32.0, 32.0, 7.0]), "head_dim": 128}
    att = fw.Op("attention", shape, 1e9, 1e9, 989e12, 4.8e12)
    want, _ = M.attention_seconds(FOLDER, 32.0, 32.0, 32 * 4095.0, 32, 8, 128)
    with M.fallbacks() as fb:
        with fw.ledger() as led:
            t = fw.price(att, EFF, name)
        fw.price(fw.Op("attention", {**shape, "family": "mla"}, 1e9, 1e9, 989e12, 4.8e12), EFF, name)
    assert t[0] == pytest.approx(float(want), rel=1e-12) and list(led.measured_share) == [1.0, 0.0, 0.0]
    assert {k[2] for k in fb.by_reason} == {M.REASONS[10], M.REASONS[9], M.REASONS[11]}


def test_weight_only_quantised_gemms_fall_back_instead_of_reading_the_compute_dtype_table():
    """int4 weights with bf16 math: the Op says bf16, the weights are 4-bit; the bf16 table would
    price the wrong kernel, so measured.device gives a backend whose GEMMs fall back (fp8 and fp4,
    whose weights are the compute dtype, keep the tables)."""
    d = M.device(GPU, fw.Precision.named("int4"))
    assert d["backend"].endswith("+weight-only")
    assert not M.device(GPU, fw.Precision.named("fp8"))["backend"].endswith("+weight-only")
    assert not M.device(GPU, fw.Precision.named("fp4"))["backend"].endswith("+weight-only")
    op = _gemm_op(64.0, 4096.0, 4096.0)
    with M.fallbacks() as fb:
        t = fw.price(op, EFF, d["backend"])
    assert t == pytest.approx(fw.roofline_backend(op, EFF)[0])
    assert [k[2] for k in fb.by_reason] == [M.REASONS[12]]


def test_reuse_reads_returns_the_same_reads_once_computed(monkeypatch):
    """Inside ``reuse_reads`` an identical table read is computed once and returns the same values
    (copies: a caller's edit does not reach the memo); outside it every read is computed."""
    g = M.table(FOLDER, "gemm").grid(("bfloat16",))
    pts = (np.array([8.0, 64.0]), np.array([4096.0]), np.array([4096.0]))
    calls = []
    real = M._interpolate
    monkeypatch.setattr(M, "_interpolate", lambda grid, p: calls.append(1) or real(grid, p))
    want = M.interpolate(g, pts)
    with M.reuse_reads():
        a = M.interpolate(g, pts)
        a[0][:] = -1.0
        b = M.interpolate(g, pts)
    assert len(calls) == 2  # once outside, once inside the block
    np.testing.assert_array_equal(b[0], want[0])
    np.testing.assert_array_equal(b[1], want[1])
    M.interpolate(g, pts)
    assert len(calls) == 3
