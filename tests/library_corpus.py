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
    modeling: str  # the library module whose code the clusters come from
    # Other files of the library (relative to its package folder) code in this model's clusters may come
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
    # What the model is built with: the package whose code holds its clusters ("transformers", "diffusers").
    library: str = "transformers"

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

_ENCODER = (
    "hidden 32, intermediate 64, 2 layers, 4 heads, vocab 128; inputs ids (2, 16) int64 + attention mask (2, 16) bool"
)
_IDS_AND_MASK = """
[tool.fuselens.models.model]
inputs = [{ shape = [2, 16], dtype = "int64" }, { shape = [2, 16], dtype = "bool" }]
"""
_IMAGE = "input (1, 3, 32, 32)"

# More architectures, analyzed, mapped into their library's files and applied and restored by the tests
# (`test_library_models.py`); whether their patched models compute what the library does is measured by
# `benchmarks/library_apply.py`.
BREADTH: list[Case] = [
    Case(
        "qwen3",
        "Qwen3",
        _DECODER + ", head_dim 8",
        """
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64)
        model = Qwen3ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.qwen3.modeling_qwen3",
        decoder=True,
    ),
    Case(
        "qwen3-moe",
        "Qwen3-MoE",
        _DECODER + ", head_dim 8, 4 experts (intermediate 32), top 2",
        """
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        config = Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=128,
                                max_position_embeddings=64, num_experts=4, num_experts_per_tok=2)
        model = Qwen3MoeForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.qwen3_moe.modeling_qwen3_moe",
        shared=("integrations/moe.py",),
        decoder=True,
    ),
    Case(
        "gemma2",
        "Gemma2",
        _DECODER + ", head_dim 8, sliding window 8",
        """
        from transformers import Gemma2Config, Gemma2ForCausalLM

        config = Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64,
                              sliding_window=8)
        model = Gemma2ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gemma2.modeling_gemma2",
        shared=("masking_utils.py",),
        decoder=True,
    ),
    Case(
        "gemma3-text",
        "Gemma3 (text)",
        _DECODER + ", head_dim 8, sliding window 8",
        """
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        config = Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64,
                                  sliding_window=8)
        model = Gemma3ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gemma3.modeling_gemma3",
        shared=("masking_utils.py",),
        decoder=True,
    ),
    Case(
        "deepseek-v3",
        "DeepSeek-V3 (MLA, MoE)",
        "hidden 32, intermediate 64, 2 layers (1 dense), 4 heads, q/kv LoRA ranks 16, rope dims 8, 4 routed experts "
        "(intermediate 32) in 2 groups, top 2, vocab 128; input (2, 16)",
        """
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        config = DeepseekV3Config(hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                                  first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
                                  q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                  v_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                                  n_group=2, topk_group=1, vocab_size=128, max_position_embeddings=64)
        model = DeepseekV3ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.deepseek_v3.modeling_deepseek_v3",
        shared=("integrations/moe.py",),
        repeats=1,
        decoder=True,
    ),
    Case(
        "falcon",
        "Falcon",
        "hidden 32, 2 layers, 4 heads, vocab 128, new decoder architecture; input (2, 16)",
        """
        from transformers import FalconConfig, FalconForCausalLM

        config = FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
                              new_decoder_architecture=True, num_kv_heads=2)
        model = FalconForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.falcon.modeling_falcon",
        shared=("masking_utils.py",),
        decoder=True,
    ),
    Case(
        "gpt2",
        "GPT-2",
        "n_embd 32, 2 layers, 4 heads, 64 positions, vocab 128; input (2, 16)",
        """
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=128, bos_token_id=1, eos_token_id=2)
        model = GPT2LMHeadModel(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gpt2.modeling_gpt2",
        shared=("activations.py",),  # GPT-2's tanh GELU, spelled out in its activation module
        decoder=True,
    ),
    Case(
        "gpt-neox",
        "GPT-NeoX",
        "hidden 32, intermediate 64, 2 layers, 4 heads, rotary 25%, vocab 128; input (2, 16)",
        """
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

        config = GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=128, max_position_embeddings=64)
        model = GPTNeoXForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gpt_neox.modeling_gpt_neox",
        decoder=True,
    ),
    Case(
        "olmo",
        "OLMo",
        _DECODER,
        """
        from transformers import OlmoConfig, OlmoForCausalLM

        config = OlmoConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, pad_token_id=0)
        model = OlmoForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.olmo.modeling_olmo",
        decoder=True,
    ),
    Case(
        "gpt-oss",
        "GPT-OSS (MoE)",
        _DECODER + ", head_dim 8, 4 experts, top 2, sliding window 8",
        """
        from transformers import GptOssConfig, GptOssForCausalLM

        config = GptOssConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, vocab_size=128, max_position_embeddings=64,
                              num_local_experts=4, num_experts_per_tok=2, sliding_window=8)
        model = GptOssForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.gpt_oss.modeling_gpt_oss",
        shared=("integrations/moe.py", "masking_utils.py"),
        decoder=True,
    ),
    Case(
        "mamba",
        "Mamba",
        "hidden 32, state 8, 2 layers, vocab 128 (the slow path: no CUDA kernels); input (2, 16)",
        """
        from transformers import MambaConfig, MambaForCausalLM

        config = MambaConfig(hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=128, expand=2, conv_kernel=4)
        model = MambaForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.mamba.modeling_mamba",
        decoder=True,
    ),
    Case(
        "mamba2",
        "Mamba2",
        "hidden 32, state 8, 4 heads of 16, chunk 8, 2 layers, vocab 128 (the slow path); input (2, 16)",
        """
        from transformers import Mamba2Config, Mamba2ForCausalLM

        config = Mamba2Config(hidden_size=32, state_size=8, num_heads=4, head_dim=16, n_groups=1, expand=2,
                              num_hidden_layers=2, vocab_size=128, chunk_size=8, conv_kernel=4)
        model = Mamba2ForCausalLM(config)  # fuselens: input=(2, 16)
        """,
        "transformers.models.mamba2.modeling_mamba2",
        decoder=True,
    ),
    Case(
        "roberta",
        "RoBERTa",
        _ENCODER,
        """
        from transformers import RobertaConfig, RobertaModel

        config = RobertaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               vocab_size=128, max_position_embeddings=64)
        model = RobertaModel(config)
        """,
        "transformers.models.roberta.modeling_roberta",
        shared=("masking_utils.py",),
        pyproject=_IDS_AND_MASK,
    ),
    Case(
        "distilbert",
        "DistilBERT",
        "dim 32, hidden 64, 2 layers, 4 heads, vocab 128; inputs ids (2, 16) int64 + attention mask (2, 16) bool",
        """
        from transformers import DistilBertConfig, DistilBertModel

        config = DistilBertConfig(dim=32, hidden_dim=64, n_layers=2, n_heads=4, vocab_size=128,
                                  max_position_embeddings=64)
        model = DistilBertModel(config)
        """,
        "transformers.models.distilbert.modeling_distilbert",
        shared=("masking_utils.py",),
        pyproject=_IDS_AND_MASK,
    ),
    Case(
        "modernbert",
        "ModernBERT",
        _ENCODER + ", local attention 8",
        """
        from transformers import ModernBertConfig, ModernBertModel

        config = ModernBertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  vocab_size=128, max_position_embeddings=64, local_attention=8,
                                  global_attn_every_n_layers=2, pad_token_id=0)
        model = ModernBertModel(config)
        """,
        "transformers.models.modernbert.modeling_modernbert",
        shared=("masking_utils.py",),
        pyproject=_IDS_AND_MASK,
    ),
    Case(
        "bart",
        "BART (encoder-decoder)",
        "d_model 32, ffn 64, 2+2 layers, 4 heads, vocab 128; inputs (2, 16) + decoder ids (2, 8) int64",
        """
        import torch.nn as nn
        from transformers import BartConfig, BartModel


        class Seq2Seq(nn.Module):
            def __init__(self):
                super().__init__()
                config = BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                    vocab_size=128, max_position_embeddings=64)
                self.bart = BartModel(config)

            def forward(self, input_ids, decoder_input_ids):
                return self.bart(input_ids=input_ids, decoder_input_ids=decoder_input_ids).last_hidden_state
        """,
        "transformers.models.bart.modeling_bart",
        shared=("masking_utils.py",),
        pyproject="""
        [tool.fuselens.models.Seq2Seq]
        inputs = [{ shape = [2, 16], dtype = "int64" }, { shape = [2, 8], dtype = "int64" }]
        """,
    ),
    Case(
        "mobilevit",
        "MobileViT",
        # batch 2 of 64×64: in training mode its last batch norms normalise 2×2 positions of 2 images (at
        # 32×32, one position of each: a gradient no float32 sum order computes twice alike)
        "image 64, hidden sizes [16, 24, 32], neck 16, channels 8-32, patch 2; input (2, 3, 64, 64)",
        """
        from transformers import MobileViTConfig, MobileViTModel

        config = MobileViTConfig(image_size=64, patch_size=2, hidden_sizes=[16, 24, 32],
                                 neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2)
        model = MobileViTModel(config)  # fuselens: input=(2, 3, 64, 64)
        """,
        "transformers.models.mobilevit.modeling_mobilevit",
    ),
    Case(
        "dinov2",
        "DINOv2",
        "image 32, patch 8, hidden 32, mlp ratio 2, 2 layers, 4 heads; " + _IMAGE,
        """
        from transformers import Dinov2Config, Dinov2Model

        config = Dinov2Config(image_size=32, patch_size=8, hidden_size=32, mlp_ratio=2, num_hidden_layers=2,
                              num_attention_heads=4)
        model = Dinov2Model(config)  # fuselens: input=(1, 3, 32, 32)
        """,
        "transformers.models.dinov2.modeling_dinov2",
    ),
    Case(
        "siglip-vision",
        "SigLIP vision",
        "image 32, patch 8, hidden 32, intermediate 64, 2 layers, 4 heads; " + _IMAGE,
        """
        from transformers import SiglipVisionConfig, SiglipVisionModel

        config = SiglipVisionConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=4)
        model = SiglipVisionModel(config)  # fuselens: input=(1, 3, 32, 32)
        """,
        "transformers.models.siglip.modeling_siglip",
    ),
    Case(
        "wav2vec2",
        "Wav2Vec2",
        "hidden 32, intermediate 64, 2 layers, 4 heads, conv features [16, 16] kernels [10, 3] strides [5, 2], "
        "positional conv 16 in 4 groups; input (1, 400)",
        """
        from transformers import Wav2Vec2Config, Wav2Vec2Model

        config = Wav2Vec2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2),
                                num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
                                do_stable_layer_norm=True, feat_extract_norm="layer")
        model = Wav2Vec2Model(config)  # fuselens: input=(1, 400)
        """,
        "transformers.models.wav2vec2.modeling_wav2vec2",
    ),
    Case(
        "unet2d",
        "UNet2DModel (diffusers)",
        "sample 16, channels (32, 64), 1 layer a block, an attention block, 8 groups; inputs (1, 3, 16, 16) + "
        "timestep (1,) int64",
        """
        from diffusers import UNet2DModel

        model = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                            block_out_channels=(32, 64), down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                            up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)
        """,
        "diffusers.models.unets.unet_2d",
        shared=("models/resnet.py", "models/attention_processor.py", "models/embeddings.py"),
        library="diffusers",
        repeats=1,
        pyproject="""
        [tool.fuselens.models.model]
        inputs = [{ shape = [1, 3, 16, 16] }, { shape = [1], dtype = "int64" }]
        """,
    ),
    Case(
        "unet2d-condition",
        "UNet2DConditionModel (diffusers)",
        "sample 8, channels (32, 64), 1 layer a block, cross-attention 32, 8 groups; inputs (1, 4, 8, 8) + "
        "timestep (1,) int64 + text (1, 4, 32)",
        """
        from diffusers import UNet2DConditionModel

        model = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                     block_out_channels=(32, 64),
                                     down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                     up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                     norm_num_groups=8, attention_head_dim=8)
        """,
        "diffusers.models.unets.unet_2d_condition",
        shared=(
            "models/resnet.py",
            "models/attention_processor.py",
            "models/attention.py",
            "models/embeddings.py",
            "models/activations.py",
            "models/transformers/transformer_2d.py",
        ),
        library="diffusers",
        repeats=1,
        pyproject="""
        [tool.fuselens.models.model]
        inputs = [{ shape = [1, 4, 8, 8] }, { shape = [1], dtype = "int64" }, { shape = [1, 4, 32] }]
        """,
    ),
    Case(
        "resnet-block2d",
        "ResnetBlock2D (diffusers)",
        "32 → 64 channels, 8 groups, time embedding 32; inputs (1, 32, 8, 8) + (1, 32)",
        """
        from diffusers.models.resnet import ResnetBlock2D

        model = ResnetBlock2D(in_channels=32, out_channels=64, temb_channels=32, groups=8)
        """,
        "diffusers.models.resnet",
        library="diffusers",
        repeats=1,
        pyproject="""
        [tool.fuselens.models.model]
        inputs = [[1, 32, 8, 8], [1, 32]]
        """,
    ),
    Case(
        "dit",
        "DiT (diffusers DiTTransformer2DModel)",
        "sample 8, patch 2, 4 channels, 2 layers, 2 heads of 16, 10 classes; inputs (1, 4, 8, 8) + timestep (1,) "
        "int64 + class (1,) int64",
        """
        from diffusers import DiTTransformer2DModel

        model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=2,
                                      sample_size=8, patch_size=2, num_embeds_ada_norm=10, norm_num_groups=8)
        """,
        "diffusers.models.transformers.dit_transformer_2d",
        shared=(
            "models/attention.py",
            "models/attention_processor.py",
            "models/embeddings.py",
            "models/normalization.py",
            "models/activations.py",
        ),
        library="diffusers",
        pyproject="""
        [tool.fuselens.models.model]
        inputs = [{ shape = [1, 4, 8, 8] }, { shape = [1], dtype = "int64" }, { shape = [1], dtype = "int64" }]
        """,
    ),
    Case(
        "autoencoder-kl",
        "AutoencoderKL (diffusers)",
        "channels (16, 32), 1 layer a block, 4 latent channels, 8 groups, sample 16; input (1, 3, 16, 16)",
        """
        from diffusers import AutoencoderKL

        model = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                              up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(16, 32),
                              layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=16)
        """,
        "diffusers.models.autoencoders.vae",  # the encoder's and decoder's own code; AutoencoderKL only calls them
        # (and its own 1x1 quant convolutions, each with its bias: a GEMM and its epilogue)
        shared=("models/resnet.py", "models/attention_processor.py", "models/autoencoders/autoencoder_kl.py"),
        library="diffusers",
        repeats=1,
        pyproject="""
        [tool.fuselens.models.model]
        inputs = [[1, 3, 16, 16]]
        """,
    ),
]

# Every architecture of the corpus.
ALL_CASES: list[Case] = [*CORPUS, *BREADTH]

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
