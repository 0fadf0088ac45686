"""JupyterLab settings for the course, read through ``JUPYTER_CONFIG_PATH``.

``make lab``, the GKE pod (``deploy/jupyter.yaml``) and the browser tests
(``tests/browser``) put this folder on ``JUPYTER_CONFIG_PATH``, so they all
serve the course the same way. A learner's own ``~/.jupyter`` settings still
win over these. The settings learners see in the browser (notebook viewer for
the paired ``.py`` files, no news prompt) are in
``labconfig/default_setting_overrides.json`` beside this file; see
``docs/jupyterlab.md``.
"""

import os

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

# Kernels inherit the server's environment. JAX takes 75% of every GPU's
# memory when its first array is made unless told otherwise, so a second open
# notebook would find the GPUs full. A value the learner set is kept.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# No requests to jupyter.org from the server: no news feed, no update check.
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
