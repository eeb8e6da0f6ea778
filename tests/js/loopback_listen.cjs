// Preloaded (`node --require`) by tests/support/mcp_app.py: a server that listens on a port
// alone (every interface) listens on 127.0.0.1 instead, so a test's MCP server stays on loopback.
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
    if (typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
