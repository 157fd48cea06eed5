"""Chapter 1's tables, numbers and checks (analysis.kv_chapter) against closed forms, and its
figures (analysis.kv_figures) drawing one series per model."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from analysis import kv, specs  # noqa: E402
from analysis import kv_chapter as ch  # noqa: E402
from analysis import kv_figures as figs  # noqa: E402

MODELS = ["GPT-2 small", "Llama-3.1-70B", "DeepSeek-V3", "Kimi-Linear-48B-A3B"]


@pytest.fixture(scope="module")
def table():
    return ch.footprint_table(MODELS, "bf16", "bf16", 131072)


def test_footprint_table_closed_forms(table):
    t = table.set_index("model")
    assert t.loc["Llama-3.1-70B", "KV bytes/token"] == 80 * 2 * 8 * 128 * 2
    assert t.loc["DeepSeek-V3", "KV bytes/token"] == 61 * (512 + 64) * 2
    assert t.loc["Llama-3.1-70B", ch.seq_column(131072)] == 131072 * 80 * 2 * 8 * 128 * 2
    assert t.loc["Llama-3.1-70B", "weights"] == 2 * kv.param_counts("Llama-3.1-70B")["total"]
    assert t.loc["Kimi-Linear-48B-A3B", "KV layers (full/sliding/linear)"] == "7/0/20"


def test_shown_table_formats(table):
    s = ch.shown_table(table, 131072).set_index("model")
    assert s.loc["Llama-3.1-70B", "KV bytes/token"] == "328 kB"
    published = specs.model("GPT-2 small").params_total_published
    assert s.loc["GPT-2 small", "params (published)"] == f"{published / 1e9:,.2f} B"


def test_param_count_max_error():
    t = pd.DataFrame({"params (counted)": [110.0, 95.0, 100.0], "params (published)": [100.0, 100.0, 100.0]})
    assert ch.param_count_max_error(t) == pytest.approx(0.10)


@pytest.mark.parametrize("key,name", ch.EXAMPLES)
def test_worked_example_product_equals_its_value(key, name):
    text = ch.worked_example(name)
    product, value = text.split(" = ")
    assert eval(product.replace("×", "*")) == kv.kv_bytes_per_token(name, "bf16")  # noqa: S307
    assert value == f"{kv.kv_bytes_per_token(name, 'bf16'):,.0f} bytes per token"


def test_kv_extremes(table):
    e = ch.kv_extremes(table)
    kvt = {m: kv.kv_bytes_per_token(m, "bf16") for m in MODELS}
    assert e["max_model"] == max(kvt, key=kvt.get) and e["min_model"] == min(kvt, key=kvt.get)
    assert e["spread"] == pytest.approx(max(kvt.values()) / min(kvt.values()))


def test_context_grid():
    c = ch.context_grid(1 << 20)
    assert c[0] == 1024 and c[-1] == 1 << 20 and np.all(np.diff(c) > 0)


def test_counts_of_models_that_fit_and_that_outweigh_their_weights():
    per_seq = {m: kv.kv_bytes(m, 1 << 20, 1, "bf16") for m in MODELS}
    hbm = sorted(per_seq.values())[1]       # exactly two fit (ties included)
    assert ch.n_fit_in_hbm(MODELS, 1 << 20, "bf16", hbm) == 2
    assert ch.n_fit_in_hbm(MODELS, 1 << 20, "bf16", 0.0) == 0
    heavy = sum(kv.kv_bytes(m, 131072, 64, "bf16") > kv.weight_bytes(m, "bf16") for m in MODELS)
    assert ch.n_kv_heavier(MODELS, 131072, 64, "bf16", "bf16") == heavy
    assert ch.n_kv_heavier(MODELS, 1024, 1, "bf16", "bf16") == 0


def test_moba_bounds():
    mb = ch.moba_bounds("Llama-3.1-8B", 1 << 20, (0.5, 0.95))
    b = mb["bound"]
    assert mb["block"] == (1 << 20) // 64
    assert b[("attention", 0.95)] > b[("attention", 0.5)] > 1
    # the whole prefill's bound is the attention bound diluted by the matmuls' share of the FLOPs
    share = mb["attention_share"]
    assert 0 < share < 1
    assert 1 / b[("whole prefill", 0.95)] == pytest.approx((1 - share) + share / b[("attention", 0.95)])


def test_checks():
    c = ch.checks()
    assert c["llama70b_kv_bytes"] == 327_680
    assert len(c["verdicts"]) == 5
    assert c["kimi_linear_reduction_1m"] > c["kimi_linear_reduction_4k"] > 0
    assert c["moba_attn_bound"] > c["moba_prefill_bound"] > 1
    assert c["growth_gpt2_small"] > c["growth_gpt2_xl"]


def test_figures_draw_one_series_per_model(table):
    fig = figs.fig_kv_per_token(table, "bf16")
    assert len(fig.axes[0].patches) == len(MODELS)
    ctx = ch.context_grid(1 << 20)
    fig2 = figs.fig_kv_vs_context(MODELS, ctx, "bf16", "H100-SXM5-80GB")
    assert len(fig2.axes[0].get_lines()) == len(MODELS) + 1  # and the HBM line
    np.testing.assert_allclose(fig2.axes[0].get_lines()[1].get_ydata(),
                               kv.kv_bytes("Llama-3.1-70B", ctx, 1, "bf16"))
    fig3 = figs.fig_kv_vs_weights(MODELS, ctx, "bf16", "bf16")
    assert len(fig3.axes[0].get_lines()) == len(MODELS) + 1
    plt.close("all")
