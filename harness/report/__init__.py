"""The run report: a stored run loaded, analysed, drawn and written as HTML and Markdown."""
