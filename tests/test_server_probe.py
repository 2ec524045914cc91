"""Language server, probe: the "Probe" lens runs the models on data in the worker, and the hover of a
GEMM line then shows its sketches and opportunities, and the lens how many there are."""

from __future__ import annotations

import pytest

from lsp_helpers import Client, example_text, server_fixture

pytestmark = pytest.mark.asyncio(loop_scope="module")

client = server_fixture()

PLANTED = example_text("probe_planted.py")


def _line(snippet: str) -> int:
    return next(number for number, text in enumerate(PLANTED.split("\n"), 1) if snippet in text)


async def test_the_probe_lens_sketches_each_gemm_line_and_its_hover_shows_them(client: Client):
    uri = client.open("probe_planted.py")
    await client.diagnostics_of(uri, 1)
    (lens,) = [lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.probe"]
    assert lens.command.title == "Probe" and list(lens.command.arguments) == [uri, "Planted"]
    assert lens.range.start.line == _line("class Planted") - 1

    result = await client.command(lens.command.command, *lens.command.arguments)
    (model,) = result["probe"]["models"]
    assert model["data_source"].startswith("probe_batches()") and model["problem"] == ""
    assert any("4 opportunities in 5 GEMM sites" in m.message for m in client.messages_matching("fuselens: probed"))

    (lens,) = [lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.probe"]
    assert lens.command.title == "◇ 4 opportunities in 5 GEMM sites · Probe again"
    text = (await client.hover(uri, _line("self.outlier("))).contents.value
    assert "◇ **probe: `linear`**, 8 calls" in text and "outlier channels [" in text and "**quantize**" in text
    assert "17" in text.split("outlier channels [")[1].split("]")[0]
    text = (await client.hover(uri, _line("self.plain("))).contents.value
    assert "no structure to exploit in these values" in text


async def test_an_edit_hides_a_probe_of_the_text_before_it(client: Client):
    uri = client.open("probe_stale.py", PLANTED)
    await client.diagnostics_of(uri, 1)
    (lens,) = [lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.probe"]
    await client.command(lens.command.command, *lens.command.arguments)
    version = client.change(uri, PLANTED.replace("50.0", "40.0"))
    client.save(uri)
    await client.diagnostics_of(uri, version)
    titles = [lens.command.title for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.probe"]
    assert titles == ["Probe"]
    hovered = await client.hover(uri, _line("self.outlier("))
    assert hovered is None or "◇ **probe:" not in hovered.contents.value


async def test_validate_with_probe_measures_each_opportunity_in_the_worker_and_the_hover_shows_it(client: Client):
    uri = client.open("probe_measured.py", PLANTED)
    await client.diagnostics_of(uri, 1)
    result = await client.command("fuselens.validateAll", uri, "Planted", {"probe": True})
    (model,) = result["probe"]["models"]
    measured = {site["line"]: site["measured"] for site in model["sites"]}
    assert [m["kind"] for m in measured[_line("self.low_rank(")]] == ["low-rank"]
    view = result["results_view"]  # what the editors open: each site's values charted
    assert view["kind"] == "probe" and len(view["models"][0]["chart"]["data"]) == 5
    assert "low-rank: 0.00% error" in result["results_markdown"]
    told = [m.message for m in client.messages_matching("probed Planted")]
    assert any("5 opportunities" not in m and "of 5 measured on" in m for m in told), told
    text = (await client.hover(uri, _line("self.outlier("))).contents.value
    assert "measured **quantize** (torch._scaled_mm (float8 e4m3)" in text and "with per-tensor scales)" in text
    assert "timing needs a CUDA GPU" in text or " ms against the dense " in text


LLAMA = """\
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
model = LlamaForCausalLM(config)  # fuselens: input=(2, 16) int64
"""


@pytest.mark.slow
async def test_a_transformers_llama_is_probed_from_its_lens_and_its_line_shows_the_library_sites(client: Client):
    pytest.importorskip("transformers")
    uri = client.open("llama_probed.py", LLAMA)
    await client.diagnostics_of(uri, 1)
    (lens,) = [lens for lens in await client.code_lenses(uri) if lens.command.command == "fuselens.probe"]
    result = await client.command(lens.command.command, *lens.command.arguments)
    (model,) = result["probe"]["models"]
    assert model["problem"] == "" and model["data_source"].startswith("synthetic normal inputs")
    (query,) = [s for s in model["sites"] if s["library"] and "self.q_proj(" in s["code"]]
    assert query["layers"] == 2  # one line of the library's code, called by both layers

    # The sites are lines of transformers' code, which this file cannot show: the line whose model runs
    # that code lists them, each with its line as it reads there and its sketches in brief.
    text = (await client.hover(uri, 5)).contents.value
    assert f"◇ **probe of `model`**: {len(model['sites'])} GEMM sites in the code it runs" in text
    assert "`transformers/models/llama/modeling_llama.py`" in text
    (listed,) = [line for line in text.split("\n") if f"`{query['code']}`" in line]
    assert f"modeling_llama.py:{query['line']}`" in listed and "over 2 layers" in listed
    assert "input 2:4 " in listed and "max/median channel " in listed and "weight rank " in listed
    hovered = await client.hover(uri, 3)  # the config's line runs nothing
    assert hovered is None or "◇ **probe" not in hovered.contents.value
