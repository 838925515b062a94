"""The HTML report templates (installed as the ``advisor_templates`` package; see advisor.render.html.templates_dir)."""
