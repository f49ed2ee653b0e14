"""The parts of `harness serve` (backends.inhouse.server), one concern each."""
