"""Fine-tuning a few layers of a loaded model: the loop recovery and prune's healing share."""
