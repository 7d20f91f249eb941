"""Real text that installs offline, and the tokenizer trained on it (shared by probes and canary)."""

from worker.text.corpus import corpus_text
from worker.text.tokenizer import corpus_token_ids, get_tokenizer, ladder_vocab, text_token_ids

__all__ = ["corpus_text", "corpus_token_ids", "get_tokenizer", "ladder_vocab", "text_token_ids"]
