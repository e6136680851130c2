"""The model config: one decoder class, architectures differ by flags; ``family`` names the family module
(meshlm/models/families/) that gives the tensors their external names and maps HF / GGUF configs."""

from __future__ import annotations

from dataclasses import dataclass

from meshlm.errors import ConfigError
from meshlm.sections import option


# The flavour of a shape given key by key rather than by name: a converted model (see model.source).
CUSTOM_FLAVOR = "custom"
# The keys that fix the weights' names and shapes: a checkpoint loads only into a model that agrees on them.
SHAPE_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden_dim", "vocab_size", "qkv_bias",
              "qk_norm", "tie_embeddings", "post_norms")
LAYER_KINDS = ("global", "sliding")
HEADS = ("lm", "lm_value", "score", "classes")


@dataclass
class ModelConfig:
    flavor: str = option("debug", "Named shape from the flavour registry; other [model] keys override it. "
                                  f"'{CUSTOM_FLAVOR}': no named shape, every key as written (converted models). With "
                                  "checkpoint.init_from the checkpoint's shape is used instead.")
    family: str = option("llama", "Model family (a module of meshlm/models/families/: llama — also Mistral, Qwen2, "
                                  "Qwen3 — or gemma3): its external tensor names, config mappers and block flags. "
                                  "Written into every checkpoint.")
    head: str = option("", "What the output head is: lm (vocabulary logits), lm_value (with a value head beside them, "
                           "PPO), score (one scalar: a reward model), classes (one logit per class); written into "
                           "every checkpoint by training; '' (checkpoints written before model.head): inferred.",
                       choices=("", *HEADS))
    dim: int = option(64, "Hidden size h.")
    n_layers: int = option(4, "Number of transformer blocks.")
    n_heads: int = option(4, "Attention (query) heads.")
    n_kv_heads: int = option(2, "Key/value heads (grouped-query attention); must divide n_heads.")
    head_dim: int = option(0, "Per-head size; 0 means dim // n_heads.")
    ffn_hidden_dim: int = option(192, "SwiGLU inner size.")
    vocab_size: int = option(2048, "Embedding rows; must be >= the tokenizer's vocabulary.")
    max_seq_len: int = option(256, "Longest context the model is trained/sampled with.")
    norm_eps: float = option(1e-5, "RMSNorm epsilon.")
    rope_theta: float = option(10000.0, "RoPE base frequency.")
    rope_scaling: str = option("none", "RoPE frequency scaling (of the global layers).",
                               choices=("none", "llama3", "linear"))
    rope_scaling_factor: float = option(8.0, "Llama-3 and linear scaling: factor.")
    rope_low_freq_factor: float = option(1.0, "Llama-3 scaling: low-frequency factor.")
    rope_high_freq_factor: float = option(4.0, "Llama-3 scaling: high-frequency factor.")
    rope_original_max_len: int = option(8192, "Llama-3 scaling: original context length.")
    qkv_bias: bool = option(False, "Bias on the q/k/v projections (Qwen2).")
    qk_norm: bool = option(False, "RMSNorm on each head's q and k before RoPE (Qwen3).")
    tie_embeddings: bool = option(False, "Share the token embedding with the output head.")
    sliding_window: int = option(0, "Sliding attention window in tokens: a query sees itself and the "
                                 "sliding_window - 1 positions before it (Mistral, Qwen2); 0: full causal attention.")
    full_attention_layers: int = option(0, "With sliding_window and no layer_kinds: the first N layers attend to "
                                        "every earlier position and the rest use the window (HF Qwen2's "
                                        "max_window_layers; the form checkpoints before layer_kinds wrote).")
    layer_kinds: list[str] = option([], "Attention kind of each layer: 'global' (every earlier position) or "
                                        "'sliding' (model.sliding_window); empty: every layer sliding when "
                                        "sliding_window > 0 (from full_attention_layers on), else global.")
    rope_local_theta: float = option(0.0, "RoPE base of the sliding layers (Gemma 3: 10000); 0: rope_theta.")
    norm_unit_offset: bool = option(False, "RMSNorm scales by (1 + w): its weights are an offset from one and "
                                           "start at zero (Gemma).")
    post_norms: bool = option(False, "An RMSNorm also after attention and after the MLP, before each residual add "
                                     "(Gemma 2/3).")
    mlp_activation: str = option("silu", "The gated MLP's activation: silu (SwiGLU) or gelu_tanh (GeGLU with the "
                                         "tanh-approximated GELU, Gemma).", choices=("silu", "gelu_tanh"))
    query_pre_attn_scalar: float = option(0.0, "Attention scores are scaled by query_pre_attn_scalar ** -0.5 (Gemma); "
                                               "0: by head_dim ** -0.5.")
    scale_embeddings: bool = option(False, "Multiply the token embeddings by sqrt(dim) (Gemma).")
    init_std: float = option(0.02, "Std of the normal init; output projections are scaled by 1/sqrt(2*n_layers).")
    source: str = option("", "Where the weights came from, for a converted model (the GGUF file or HF folder name, "
                             "set by `meshlm convert`); kept by runs initialised from it. Informational only.")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.dim // self.n_heads

    def resolved_layer_kinds(self) -> tuple[str, ...]:
        """Each layer's attention kind, "global" or "sliding": ``layer_kinds``, or what the keys before it say."""
        if self.layer_kinds:
            return tuple(self.layer_kinds)
        return tuple("sliding" if self.sliding_window and i >= self.full_attention_layers else "global"
                     for i in range(self.n_layers))

    def layer_window(self, layer_id: int) -> int:
        """The attention window of layer ``layer_id`` (global index); 0 means full causal attention."""
        return self.sliding_window if self.resolved_layer_kinds()[layer_id] == "sliding" else 0

    @property
    def local_rope(self) -> bool:
        """Whether sliding layers rotate by tables of their own: a base of their own, or unscaled beside scaled
        global layers (Gemma 3 with rope_scaling)."""
        return bool(self.rope_local_theta) and "sliding" in self.resolved_layer_kinds() and \
            (self.rope_local_theta != self.rope_theta or self.rope_scaling != "none")

    def validate(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden_dim", "vocab_size", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.head_dim < 0:
            raise ConfigError(f"model.head_dim must be 0 (derive) or positive, got {self.head_dim}")
        if self.head_dim == 0 and self.dim % self.n_heads:
            raise ConfigError(f"model.dim ({self.dim}) is not divisible by model.n_heads ({self.n_heads}); "
                              "change one of them or set model.head_dim")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_heads ({self.n_heads}) must be a multiple of model.n_kv_heads "
                              f"({self.n_kv_heads})")
        if self.resolved_head_dim % 2:
            raise ConfigError(f"head size {self.resolved_head_dim} must be even for rotary embeddings")
        if self.sliding_window < 0 or self.full_attention_layers < 0:
            raise ConfigError(f"model.sliding_window ({self.sliding_window}) and model.full_attention_layers "
                              f"({self.full_attention_layers}) must be >= 0 (sliding_window 0 turns the window off)")
        if self.norm_eps <= 0 or self.rope_theta <= 0 or self.init_std <= 0:
            raise ConfigError("model.norm_eps, model.rope_theta and model.init_std must be positive")
        if self.rope_local_theta < 0 or self.query_pre_attn_scalar < 0:
            raise ConfigError("model.rope_local_theta and model.query_pre_attn_scalar must be >= 0 (0: the default)")
        self._validate_layer_kinds()
        from meshlm.models.families import family_spec  # torch-free; here to keep the import graph a tree

        spec = family_spec(self.family)
        wrong = {k: v for k, v in (spec.flags or {}).items() if getattr(self, k) != v}
        if wrong:
            raise ConfigError(f"model.family '{self.family}' needs " + ", ".join(
                f"model.{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in wrong.items()) +
                f" (got {', '.join(repr(getattr(self, k)) for k in wrong)}); set them or use a {self.family} flavour")

    def _validate_layer_kinds(self) -> None:
        if not self.layer_kinds:
            return
        if self.full_attention_layers:
            raise ConfigError("model.layer_kinds and model.full_attention_layers both set; choose one (layer_kinds "
                              "lists every layer's kind)")
        bad = sorted(set(self.layer_kinds) - set(LAYER_KINDS))
        if len(self.layer_kinds) != self.n_layers or bad:
            raise ConfigError(f"model.layer_kinds must list {self.n_layers} kinds (one per layer) of "
                              f"{', '.join(LAYER_KINDS)}; got {len(self.layer_kinds)}{f' with {bad}' if bad else ''}")
        if "sliding" in self.layer_kinds and not self.sliding_window:
            raise ConfigError("model.layer_kinds has sliding layers but model.sliding_window is 0; set the window")

    def num_params(self, include_embedding: bool = True) -> int:
        """Parameter count from the family spec's declared shapes (meshlm/models/counts.py; the model's own count
        must agree, a test checks it)."""
        from meshlm.models.counts import num_params, shape_of

        return num_params(shape_of(self), include_embedding)
