// The results view's page script: lays out the server's results view (the JSON block
// #fuselens-results, see src/results.ts) and draws each model's chart with plotly.js.
// Every cell and title is the server's text, shown as text (never parsed as HTML); the
// figures are the server's, given the editor theme's colours. Nothing is recomputed here.
(function () {
  "use strict";

  const view = JSON.parse(document.getElementById("fuselens-results").textContent);
  const root = document.getElementById("root");

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) {
      node.textContent = text;
    }
    if (className) {
      node.className = className;
    }
    return node;
  }

  function table(columns, rows, className) {
    const node = element("table", undefined, className);
    const head = node.appendChild(element("thead")).appendChild(element("tr"));
    columns.forEach((column) => head.appendChild(element("th", column)));
    const body = node.appendChild(element("tbody"));
    rows.forEach((row) => {
      const line = body.appendChild(element("tr"));
      row.forEach((cell) => line.appendChild(element("td", cell)));
    });
    return node;
  }

  // The editor theme's colours, read from the CSS variables VS Code sets on the page.
  function themed(layout) {
    const css = getComputedStyle(document.body);
    const colour = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
    const foreground = colour("--vscode-editor-foreground", "#444");
    const grid = colour("--vscode-editorWidget-border", "rgba(128, 128, 128, 0.35)");
    const colorway = ["blue", "orange", "green", "purple", "red", "yellow"]
      .map((name) => colour("--vscode-charts-" + name, ""))
      .filter(Boolean);
    const themedLayout = Object.assign({}, layout, {
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: Object.assign({}, layout.font, { color: foreground, family: colour("--vscode-font-family", "sans-serif") }),
    });
    if (colorway.length) {
      themedLayout.colorway = colorway;
    }
    // Only the axes the figure has: plotly reads every "yaxisN" key as an axis.
    Object.keys(layout)
      .filter((key) => /^[xy]axis\d*$/.test(key))
      .forEach((key) => {
        themedLayout[key] = Object.assign({}, layout[key], { gridcolor: grid, zerolinecolor: grid, linecolor: grid });
      });
    return themedLayout;
  }

  const charts = [];

  function draw() {
    return Promise.all(
      charts.map(({ node, figure }) =>
        Plotly.react(node, figure.data, themed(figure.layout), { displaylogo: false, responsive: true }),
      ),
    );
  }

  root.appendChild(element("h1", "fuselens results: " + view.file));
  root.appendChild(element("p", view.summary, "note"));
  view.models.forEach((model) => {
    const section = root.appendChild(element("section", undefined, "model"));
    section.appendChild(element("h2", model.heading));
    if (model.no_data) {
      // Nothing measured or checked: why, where the table and the chart would be (never an empty chart).
      section.appendChild(element("p", "No data: " + model.no_data, "no-data"));
      return;
    }
    section.appendChild(table(view.columns, model.rows, "results"));
    if (model.whole_model) {
      section.appendChild(element("p", model.whole_model));
    }
    const node = section.appendChild(element("div", undefined, "chart"));
    charts.push({ node, figure: model.chart });
    if (model.history.rows.length) {
      section.appendChild(element("h3", model.history.title));
      section.appendChild(table(model.history.columns, model.history.rows, "history"));
    }
  });
  view.problems.forEach((problem) => root.appendChild(element("p", problem, "problem")));
  if (!view.models.length && !view.problems.length) {
    root.appendChild(element("p", "Nothing was validated.", "note"));
  }

  // (Tests wait on this; a theme change redraws with the new colours.)
  window.fuselensDrawn = draw();
  new MutationObserver(() => void draw()).observe(document.body, { attributes: true, attributeFilter: ["class"] });
})();
