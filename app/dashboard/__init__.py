"""The status dashboard: server-rendered pages at / (problems, leaderboards, submissions), plots with plotly.js
served from the installed `plotly` package, and a running audit's page kept current by polling a fragment."""
