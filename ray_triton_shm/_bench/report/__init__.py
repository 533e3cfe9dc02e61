"""The bench's results, presented: drawn from :mod:`.._results` and :mod:`.._summary` alone,
without Ray, any path or tritonclient.

* :mod:`._text`: the wording the terminal and the report share, in plain text;
* :mod:`._console`: progress, the summary and the tables in the terminal (rich);
* :mod:`._html`: the self-contained HTML report;
* :mod:`._figures`: the summary figure and each model's curves (matplotlib);
* :mod:`._json`: ``bench.json``.
"""
