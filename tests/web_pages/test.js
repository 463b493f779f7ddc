document.getElementById("status").dataset.loaded = "yes";
