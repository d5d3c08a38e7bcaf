"""Reranking: a query's documents ordered by relevance (docs/rerank.md).

Two kinds of scorer, one result shape: ``cross_encoder.CrossEncoder`` runs an exported
sequence-classification model (bge-reranker, ms-marco-MiniLM) on onnxruntime over (query,
document) pairs; ``judge`` asks any chat model whether a document answers the query and scores
P("yes") from its first-token log-probabilities (the Qwen3-Reranker method), through the engine.
"""

from ortserve.rerank.ranking import Ranked, order

__all__ = ["Ranked", "order"]
