"""Real pretrained targets built from installed packages (no hub at run time), and their drafts."""
