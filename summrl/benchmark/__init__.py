"""`python -m summrl.benchmark`: trained checkpoints against frontier models, on training's val split, prompt,
judge and reward. Modules: ``config`` (schema and checks), ``cost`` (the cost guard), ``sources`` (who writes
the summaries), ``serving`` (checkpoints on an endpoint), ``rows`` (the resumable rows file), ``summary``
(table and confidence intervals), ``charts``, ``runner`` (the whole run).
"""
