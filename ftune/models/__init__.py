"""Model families' structure that both sides need (which part of a vision-language model a module belongs to)."""
