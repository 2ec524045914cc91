"""A corpus of transformers models, written as a user would write them: tiny random-init configurations.

Each case is the text of a user's file (a module-level model object with a `# fuselens:` comment,
or a `pyproject.toml` entry beside it when a model takes several inputs) and what its analysis
must show.  `tests/test_library_models.py` checks them; `benchmarks/library_models.py` tabulates the
same corpus (and a Llama-7B-shaped configuration, analysis only).  Nothing is downloaded: every model
is built from a configuration in the file.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    id: str  # the test id and file name
    architecture: str  # as the docs table names it
    config: str  # the configuration, in words, for the table
    source: str  # the user's file
    modeling: str  # the transformers module whose code the clusters come from
    # Other files of transformers (relative to its package folder) code in this model's clusters may come
    # from: mask functions, the experts' shared forward, the attention integration.
    shared: tuple[str, ...] = ()
    repeats: int = 2  # the most instances of one cluster: its layers per stage
    decoder: bool = False  # a decoder LLM
    experts: str = ""  # the module path part of the experts, for a mixture of experts
    # Where torch.compile would split the graph (and so must the analysis): (function, line text), for
    # experts that loop over the tokens each one got.
    breaks: tuple[tuple[str, str], ...] = ()
    pyproject: str = ""  # a pyproject.toml written beside the file
    validate: bool = True  # check every kernel against eager in the interpreter

    def write(self, folder: str) -> str:
        """The case's file (and its pyproject.toml) in `folder`; returns the file's path."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{self.id}.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(textwrap.dedent(self.source).lstrip("\n"))
        if self.pyproject:
            with open(os.path.join(folder, "pyproject.toml"), "w", encoding="utf-8") as fh:
                fh.write(textwrap.dedent(self.pyproject).lstrip("\n"))
        return path


_DECODER = "hidden 32, intermediate 64, 2 layers, 4 heads (2 kv), vocab 128; input (2, 16)"

CORPUS: list[Case] = [
    Case(
        "llama",
        "Llama",
        _DECODER,
        """
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
        model = LlamaForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.llama.modeling_llama",
        decoder=True,
    ),
    Case(
        "mistral",
        "Mistral",
        _DECODER + ", sliding window 8",
        """
        from transformers import MistralConfig, MistralForCausalLM

        config = MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, sliding_window=8)
        model = MistralForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.mistral.modeling_mistral",
        shared=("masking_utils.py",),  # the sliding-window mask
        decoder=True,
    ),
    Case(
        "qwen2",
        "Qwen2",
        _DECODER,
        """
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
        model = Qwen2ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.qwen2.modeling_qwen2",
        decoder=True,
    ),
    Case(
        "gemma",
        "Gemma",
        _DECODER + ", head_dim 8",
        """
        from transformers import GemmaConfig, GemmaForCausalLM

        config = GemmaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64)
        model = GemmaForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gemma.modeling_gemma",
        decoder=True,
    ),
    Case(
        "phi3",
        "Phi-3",
        _DECODER,
        """
        from transformers import Phi3Config, Phi3ForCausalLM

        config = Phi3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2)
        model = Phi3ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.phi3.modeling_phi3",
        decoder=True,
    ),
    Case(
        "mixtral",
        "Mixtral (MoE)",
        _DECODER + ", 4 experts, top 2",
        """
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                               num_local_experts=4, num_experts_per_tok=2)
        model = MixtralForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.mixtral.modeling_mixtral",
        shared=("integrations/moe.py",),  # the experts' forward, grouped_mm by default
        decoder=True,
        experts="mlp.experts",
    ),
    Case(
        "mixtral-eager-experts",
        "Mixtral (MoE), eager experts",
        _DECODER + ', 4 experts, top 2, `experts_implementation="eager"`',
        """
        from transformers import MixtralConfig, MixtralForCausalLM

        config = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                               num_local_experts=4, num_experts_per_tok=2, experts_implementation="eager")
        model = MixtralForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.mixtral.modeling_mixtral",
        decoder=True,
        experts="mlp.experts",
        # the loop over the experts that got tokens: `.nonzero()`, `if expert_idx == ...`, `torch.where(mask)`
        breaks=(
            ("MixtralExperts.forward", "expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()"),
            ("MixtralExperts.forward", "if expert_idx == self.num_experts:"),
            ("MixtralExperts.forward", "top_k_pos, token_idx = torch.where(expert_mask[expert_idx])"),
        ),
    ),
    Case(
        "qwen2-moe",
        "Qwen2-MoE",
        _DECODER + ", 4 experts (intermediate 32), top 2, shared expert 64",
        """
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

        config = Qwen2MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                                shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                                num_experts=4, num_experts_per_tok=2)
        model = Qwen2MoeForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.qwen2_moe.modeling_qwen2_moe",
        shared=("masking_utils.py", "integrations/moe.py"),
        decoder=True,
        experts="mlp.experts",
    ),
    Case(
        "bert",
        "BERT",
        "hidden 32, intermediate 64, 2 layers, 4 heads, vocab 128; inputs ids (2, 16) int64 + attention mask (2, 16) bool",
        """
        from transformers import BertConfig, BertModel

        config = BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            vocab_size=128, max_position_embeddings=64)
        model = BertModel(config)
        """,
        "transformers.models.bert.modeling_bert",
        shared=("masking_utils.py",),  # the padding mask
        pyproject="""
        [tool.fuselens.models.model]
        inputs = [{ shape = [2, 16], dtype = "int64" }, { shape = [2, 16], dtype = "bool" }]
        """,
    ),
    Case(
        "t5",
        "T5 (encoder-decoder)",
        "d_model 32, d_ff 64, 2+2 layers, 4 heads, vocab 128; inputs (2, 16) + decoder ids (2, 8) int64",
        """
        import torch.nn as nn
        from transformers import T5Config, T5Model


        class Seq2Seq(nn.Module):
            def __init__(self):
                super().__init__()
                config = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                                  vocab_size=128, relative_attention_num_buckets=8)
                self.t5 = T5Model(config)

            def forward(self, input_ids, decoder_input_ids):
                return self.t5(input_ids=input_ids, decoder_input_ids=decoder_input_ids).last_hidden_state
        """,
        "transformers.models.t5.modeling_t5",
        shared=("integrations/sdpa_attention.py",),
        pyproject="""
        [tool.fuselens.models.Seq2Seq]
        inputs = [{ shape = [2, 16], dtype = "int64" }, { shape = [2, 8], dtype = "int64" }]
        """,
    ),
    Case(
        "vit",
        "ViT",
        "image 32, patch 8, hidden 32, intermediate 64, 2 layers, 4 heads; input (1, 3, 32, 32)",
        """
        from transformers import ViTConfig, ViTModel

        config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=4)
        model = ViTModel(config)  # fuselens: input=(1, 3, 32, 32)
        """,
        "transformers.models.vit.modeling_vit",
    ),
    Case(
        "convnext",
        "ConvNeXt",
        "hidden sizes [16, 32], depths [3, 3], patch 4; input (1, 3, 32, 32)",
        """
        from transformers import ConvNextConfig, ConvNextModel

        config = ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[3, 3], num_stages=2, patch_size=4)
        model = ConvNextModel(config)  # fuselens: input=(1, 3, 32, 32)
        """,
        "transformers.models.convnext.modeling_convnext",
        # the last block of a stage fuses with what follows it (the next stage's norm, the pooler): the
        # blocks before it repeat
        repeats=2,
    ),
    Case(
        "swin",
        "Swin",
        "image 32, patch 4, embed 16, depths [2, 2], heads [2, 4], window 4; input (1, 3, 32, 32)",
        """
        from transformers import SwinConfig, SwinModel

        config = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[2, 2],
                            num_heads=[2, 4], window_size=4)
        model = SwinModel(config)  # fuselens: input=(1, 3, 32, 32)
        """,
        "transformers.models.swin.modeling_swin",
    ),
    Case(
        "resnet",
        "ResNet",
        "basic layers, embedding 16, hidden sizes [16, 32], depths [2, 2]; input (1, 3, 32, 32)",
        """
        from transformers import ResNetConfig, ResNetModel

        config = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[2, 2],
                              layer_type="basic")
        model = ResNetModel(config)  # fuselens: input=(1, 3, 32, 32)
        """,
        "transformers.models.resnet.modeling_resnet",
    ),
    Case(
        "whisper-encoder",
        "Whisper encoder",
        "d_model 32, ffn 64, 2 encoder layers, 4 heads, 16 mel bins, 16 positions; input (1, 16, 32)",
        """
        from transformers import WhisperConfig, WhisperModel

        config = WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                               decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64, num_mel_bins=16,
                               max_source_positions=16, vocab_size=128, pad_token_id=0, bos_token_id=1,
                               eos_token_id=2, decoder_start_token_id=1)
        model = WhisperModel(config).get_encoder()  # fuselens: input=(1, 16, 32)
        """,
        "transformers.models.whisper.modeling_whisper",
    ),
]

# Analysis only (too large to run in the interpreter): the benchmark's table.
LLAMA_7B = Case(
    "llama-7b",
    "Llama-7B shape",
    "hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000; input (1, 2048)",
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096)
    model = LlamaForCausalLM(config)  # fuselens: input=(1, 2048)
    """,
    "transformers.models.llama.modeling_llama",
    repeats=32,
    decoder=True,
    validate=False,
)
