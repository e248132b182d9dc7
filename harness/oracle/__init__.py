"""The oracle: the float64 reference, the same-precision baseline, and the verdict that compares them."""
