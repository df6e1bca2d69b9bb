// The custom resources (JSON array, argv[2]) against their CRD schemas as
// @kubernetes-models/prometheus-operator and @kubernetes-models/cert-manager ship them. Node resolves the package from the
// script's own folder, so scripts/deploy/crd-schemas.sh copies this file beside the package.
import fs from "node:fs";
import { ServiceMonitor, PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { Certificate, Issuer } from "@kubernetes-models/cert-manager/cert-manager.io/v1";
const kinds = { ServiceMonitor, PrometheusRule, Certificate, Issuer };
const docs = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
for (const doc of docs) {
  const Model = kinds[doc.kind];
  if (!Model) { console.error(`FAIL: no schema for ${doc.kind}`); process.exit(1); }
  try { new Model(doc).validate(); }
  catch (e) { console.error(`FAIL: ${doc.kind}/${doc.metadata.name}: ${e.message}`); process.exit(1); }
}
console.log(`   ${docs.length} custom resources valid`);
