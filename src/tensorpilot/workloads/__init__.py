"""Built-in workloads (gpt, mlp, cnn) and user-supplied ones (package.module:factory)."""
