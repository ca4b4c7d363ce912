"""Evaluation harness adapters (lm-evaluation-harness: lm_eval_model.py)."""
