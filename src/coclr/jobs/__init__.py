"""Jobs: the work of a study or of ``coclr learn`` as typed tasks (:mod:`coclr.jobs.tasks`), each run in a child
process, a few at a time (:mod:`coclr.jobs.scheduler`): the one way coclr starts a child, with progress, an ETA,
and every child stopped with its parent."""
