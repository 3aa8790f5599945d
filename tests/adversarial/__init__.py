"""Adversarial pass harness for rppo_td (issue 8, "Nothing lost, nothing silently wrong").

Run ``python -m tests.adversarial.run_pass --help``. Nothing here is collected by pytest (no
``test_*.py`` files); importing this package has no side effects, so that
``tests.adversarial.envs`` (the faulty gymnasium envs) imports cheaply in a training
subprocess.
"""
