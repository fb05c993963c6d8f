// fx console: the only script. A verify button says it is running (the CPU re-execution takes
// a while); a timeline row is clickable as a whole. No framework, no build step.
document.querySelectorAll("form.verify-form").forEach(function (form) {
  form.addEventListener("submit", function () {
    var button = form.querySelector("button");
    if (button) { button.disabled = true; button.textContent = "re-executing on the CPU…"; }
  });
});
var focused = document.querySelector("tr.focus");
if (focused) { focused.scrollIntoView({block: "center"}); }
