"""ftune: declarative fine-tuning for LLMs. Version only; nothing heavy is imported here."""

__version__ = "0.1.0"
