

def the_run(results_dir):
    """The one run folder under `results_dir` (beside it the history index's folder, made by the report's history
    section, may sit: iterdir's order is the filesystem's)."""
    (run,) = [p for p in results_dir.iterdir() if (p / "env.json").exists()]
    return run
