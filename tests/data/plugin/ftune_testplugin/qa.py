def encode(row, tokenizer):
    """'Q: question A: answer<eos>', loss on the answer and EOS only."""
    prompt = tokenizer(f"Q: {row['question']} A:")["input_ids"]
    answer = tokenizer(" " + row["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt + answer, [-100] * len(prompt) + answer
