"""Real pretrained targets built from installed packages (no hub at run time); their drafts are built by
`recipes/real`."""
