"""CPU-sized shapes with Ouro's proportions (MHA, SwiGLU ~2.75x, 4 loops) for speed measurements
that must run on a 2-core machine; the paper's real shapes are the presets in config.py."""

SPEED_SHAPES = {
    "cpu-mid": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8,
                    num_key_value_heads=8, vocab_size=4096, max_position_embeddings=65536),
    # the embedded default's teacher (config/default.yaml source.pretrain) on its 24-symbol vocabulary
    "embedded": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, vocab_size=24, max_position_embeddings=1024, rope_theta=10_000.0),
    "tiny": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=4, vocab_size=512, max_position_embeddings=65536),
}
