"""After training: resolve a run or model (`source`), load it for generation (`load`), merge it (`merge`), chat
with it (`chat`). The decoding itself and the generation metrics live in `ftune.generation`, which the
end of a run shares."""
