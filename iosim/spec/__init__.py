"""What is asked: the problem object (shapes, heads, dtypes), the schedule, and the KV cache formats."""
