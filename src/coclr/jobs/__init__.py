"""Commands run as child processes, a few at a time: the one way a job made of other jobs starts them (a study's
stages, learn's side-by-side InfoNCE stages), with progress, an ETA, and every child stopped with its parent."""
