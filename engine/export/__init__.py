"""A model an experiment made, written as a Hugging Face folder that loads anywhere: weights,
config, tokenizer, a model card, a mergekit recipe, a PEFT adapter, and an upload to the Hub."""
