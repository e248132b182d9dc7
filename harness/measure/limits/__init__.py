"""Physical limits: a case's FLOPs and bytes, the measured peaks, memory bandwidth, the roofline."""
