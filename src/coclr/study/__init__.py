"""The paper's study: every row of Table 1 trained and evaluated from one configuration (``coclr study``).

- :mod:`coclr.study.config`: the rows, columns and options (defaults: the quick study of ``coclr demo``);
- :mod:`coclr.study.plan`: the jobs each row needs, shared stages once, checked before any work;
- the jobs run as child processes, a few at a time, with progress and an ETA (:mod:`coclr.jobs.scheduler`);
- :mod:`coclr.study.run`: data, training, evaluation and the report, resumable;
- :mod:`coclr.study.results`: the table beside the paper's numbers, the claims, the spread over seeds.
"""

from coclr.study.config import ROWS, StudyConfig
from coclr.study.run import run_seeds, run_study

__all__ = ["ROWS", "StudyConfig", "run_seeds", "run_study"]
