"""Test-only (tests/e2e/test_rl.py puts this folder on PYTHONPATH): sampling noise that depends only on where a row
sits in the global generation batch, so a run on 1 process and one on 2 draw the same completions, and their curves
can be compared step for step instead of statistically.

TRL gives process r the rows [r*b, (r+1)*b) of the global generation batch (b rows per process). While
`generate` runs, each `torch.multinomial` draw (transformers' sampling step) becomes a Gumbel-max draw with noise
seeded by (the generate call, the token position, the global row). Each rank appends what it generated to
`$FTUNE_ROW_SAMPLING/rank<RANK>.jsonl` (one line per generate call: the completions' token ids, trailing padding
cut), so a test can check how the generation batch was split. Off unless FTUNE_ROW_SAMPLING is set."""

import os

if os.environ.get("FTUNE_ROW_SAMPLING"):
    import importlib.util

    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        import json

        import torch
        from transformers.generation.utils import GenerationMixin

        _state = {"call": 0, "pos": 0, "active": False}
        _generate = GenerationMixin.generate
        _multinomial = torch.multinomial

        def _record(output, prompt_len: int, pad) -> None:
            rows = []
            for row in output[:, prompt_len:].tolist():
                while row and row[-1] == pad:
                    row.pop()
                rows.append(row)
            folder = os.environ["FTUNE_ROW_SAMPLING"]
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
                f.write(json.dumps({"call": _state["call"], "rows": rows}) + "\n")

        def generate(self, *args, **kwargs):
            _state["call"] += 1
            _state["pos"] = 0
            _state["active"] = True
            try:
                out = _generate(self, *args, **kwargs)
            finally:
                _state["active"] = False
            ids = kwargs.get("input_ids", args[0] if args else None)
            config = kwargs.get("generation_config") or self.generation_config
            if isinstance(out, torch.Tensor) and ids is not None:
                _record(out, ids.shape[1], config.pad_token_id)
            return out

        def multinomial(probs, num_samples=1, *args, **kwargs):
            if not _state["active"] or probs.dim() != 2 or num_samples != 1:
                return _multinomial(probs, num_samples, *args, **kwargs)
            b = probs.shape[0]
            first = int(os.environ.get("RANK", "0")) * b
            picks = []
            for i in range(b):
                g = torch.Generator().manual_seed(1_000_003 * _state["call"] + 1009 * _state["pos"] + first + i)
                u = torch.rand(probs.shape[1], generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
                picks.append(torch.argmax(probs[i].double().clamp_min(1e-30).log() - (-u.log()).log()))
            _state["pos"] += 1
            return torch.stack(picks).view(b, 1).to(probs.device)

        GenerationMixin.generate = generate
        torch.multinomial = multinomial
