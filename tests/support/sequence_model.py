"""The tiny model the sequence-training tests train (random and Parquet histories alike)."""


def tiny_sequence_model(rows: int, steps: int) -> list[str]:
    """Flags of a small DIN model with ``rows``-row tables, trained ``steps`` steps by
    SGD, no validation or test: a launch of a few seconds."""
    return [
        "--num_embeddings",
        str(rows),
        "--embedding_dim",
        "8",
        "--dense_arch_layer_sizes",
        "16,8",
        "--over_arch_layer_sizes",
        "16,1",
        "--din_attention_layer_sizes",
        "8",
        "--optimizer",
        "sgd",
        "--learning_rate",
        "0.5",
        "--seed",
        "5",
        "--limit_train_batches",
        str(steps),
        "--limit_val_batches",
        "0",
        "--limit_test_batches",
        "0",
        "--log_every_n_steps",
        "100",
        "--device",
        "cpu",
    ]
