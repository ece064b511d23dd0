"""Reports, the presentation layer: the document model (tables defined once as
``TableDefinition``s, ``HeadMaps`` figures), one renderer per medium (``html``: the report
page and the notebook fragment; ``markdown``; ``text``: CSV and the terminal), plots and
report writing. Below the code that produces results (probes, toy,
pretrained_analysis), which builds report content from its results; above interp."""
