"""What is tested: the case spec, mask specs and named case matrices."""
