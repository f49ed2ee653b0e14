"""The in-house engine: `dspark_core` behind continuous batching, verification policies and load generation."""
