"""What Polar trains on: its token contract, its verdict pipeline (model, findings, rules), the in-trainer opinion and switch, the tokenizer."""
