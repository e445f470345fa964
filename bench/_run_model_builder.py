"""onnxruntime-genai's model builder, with Gemma-3's rope parameters as it reads them.

Why: transformers 5 keeps a Gemma-3 text config's rotary parameters per layer type
(``rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}``);
onnxruntime-genai 0.18.0's builder reads ``rope_parameters["rope_type"]`` and
``rope_local_base_freq`` (transformers 4's spelling) and stops with a KeyError. This runs
the builder (``python -m onnxruntime_genai.models.builder``, same arguments) with the
loaded config flattened the way the builder expects: the full-attention layers'
parameters as ``rope_parameters`` and the sliding layers' theta as
``rope_local_base_freq``. Any other config passes through unchanged.

    python bench/_run_model_builder.py -i hf -o out -p fp32 -e cpu ...
"""

from __future__ import annotations

import runpy

import transformers


def flatten_rope(config):
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and "full_attention" in rope and "sliding_attention" in rope:
        config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
        config.rope_parameters = dict(rope["full_attention"])
    return config


def main() -> None:
    load = transformers.AutoConfig.from_pretrained

    def from_pretrained(*args, **kwargs):
        return flatten_rope(load(*args, **kwargs))

    transformers.AutoConfig.from_pretrained = from_pretrained
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
