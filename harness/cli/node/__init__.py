"""What a GPU node needs: setup's install steps, the offline wheelhouse, the acceptance run (selftest) and its plan."""
