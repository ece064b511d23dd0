"""Reports: the document model, its HTML and Markdown renderers, plots, shared report
sections and table helpers. Below the code that produces results (toy,
pretrained_analysis), above interp and probes."""
