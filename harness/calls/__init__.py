"""One backend call and what runs beside it in its worker: the call, its inputs and contract, the timed round."""
