"""`slurm-titan report`: one self-contained HTML page (and a PNG of it) of a run across its attempts.

data: what is drawn, from the job folder (torch- and plotly-free); page: the HTML (plotly, the
`report` extra); browser: a headless Chromium for the PNG; command: the CLI command.
"""
